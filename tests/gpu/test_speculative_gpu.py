"""On a CUDA GPU: speculative decoding through the Triton backend, with CUDA
graphs (drafting steps replay the prefill graphs; the draft model follows
the padded graph batches eagerly) and eagerly, float32: greedy tokens
identical to the same engine without drafts and to the CPU path, n-gram
drafts accepted, and the target's own checkpoint as draft model accepted
every time. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

from octavo import SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


def test_speculative_decoding_on_gpu_matches_plain_decoding(llama_dir, make_llm):
    prompts = [{"prompt_token_ids": [(13 * i + 7 * (j % 6)) % 200 + 3 for j in range(5 + 9 * i)]} for i in range(6)]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in make_llm(llama_dir, platform="cpu").generate(prompts, params)]
    for options in (dict(platform="cuda"), dict(platform="cuda", enforce_eager=True)):
        plain = make_llm(llama_dir, **options)
        assert [o.outputs[0].token_ids for o in plain.generate(prompts, params)] == expected, options
        spec = make_llm(llama_dir, speculative_config=NGRAM, **options)
        assert [o.outputs[0].token_ids for o in spec.generate(prompts, params)] == expected, options
        assert spec.engine.get_stats().spec_decoding.num_accepted_tokens > 0


def test_draft_model_on_gpu_follows_the_target(llama_dir, make_llm):
    prompts = [{"prompt_token_ids": [(11 * i + 5 * j) % 300 + 3 for j in range(4 + 13 * i)]} for i in range(5)]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in make_llm(llama_dir, platform="cpu").generate(prompts, params)]
    draft = {"model": str(llama_dir), "num_speculative_tokens": 3}
    for options in (dict(platform="cuda"), dict(platform="cuda", enforce_eager=True)):
        llm = make_llm(llama_dir, speculative_config=draft, **options)
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == expected, options
        stats = llm.engine.get_stats().spec_decoding
        assert stats.num_accepted_tokens == stats.num_draft_tokens > 0, options
