"""On a CUDA GPU: n-gram speculative decoding through the Triton backend,
with CUDA graphs (drafting steps replay the prefill graphs) and eagerly,
float32: greedy tokens identical to the same engine without drafts and to
the CPU path, with drafts accepted. Skipped without a GPU."""

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
