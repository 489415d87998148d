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


def test_eagle3_head_on_gpu_guesses_what_it_should(llama_dir, make_llm, tmp_path, monkeypatch):
    """The head's steps run eagerly beside the target's graphs: its hidden
    states come from the buffer the replayed graphs write. Every draft is
    the plain CPU recomputation's; the outputs are the CPU's."""
    from tests.runtime.eagle_reference import ReferenceEagle3, build_eagle3_head
    from tests.runtime.proposal_recorder import record_proposals

    head = build_eagle3_head(tmp_path / "eagle3", llama_dir)
    reference = ReferenceEagle3(head, llama_dir)
    proposals = record_proposals(monkeypatch)
    prompts = [{"prompt_token_ids": [(7 * i + 3 * j) % 300 + 3 for j in range(6 + 11 * i)]} for i in range(5)]
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in make_llm(llama_dir, platform="cpu").generate(prompts, params)]
    config = {"method": "eagle3", "model": str(head), "num_speculative_tokens": 3}
    for options in (dict(platform="cuda"), dict(platform="cuda", enforce_eager=True)):
        proposals.clear()
        llm = make_llm(llama_dir, speculative_config=config, enable_prefix_caching=False, **options)
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == expected, options
        assert len(proposals) > 20, options
        for known, drafts in proposals[::4]:
            assert drafts == reference.drafts(known, len(drafts)), (options, len(known))


def test_mtp_layer_on_gpu_guesses_what_it_should(make_llm, tmp_path, tokenizer_dir, monkeypatch):
    """GLM-4.5's multi-token-prediction layer (latent attention-free, a MoE
    block through the fused-MoE kernel) beside the target's graphs: every
    draft is the CPU recomputation's; the outputs are the CPU path's."""
    from tests.runtime.mtp_reference import ReferenceMtp, build_with_mtp
    from tests.runtime.proposal_recorder import record_proposals

    path, full, extra = build_with_mtp(tmp_path / "glm45", tokenizer_dir)
    reference = ReferenceMtp(path, full, extra)
    proposals = record_proposals(monkeypatch)
    prompts = [{"prompt_token_ids": [(5 * i + 7 * j) % 300 + 3 for j in range(6 + 10 * i)]} for i in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in make_llm(path, platform="cpu").generate(prompts, params)]
    for options in (dict(platform="cuda"), dict(platform="cuda", enforce_eager=True)):
        proposals.clear()
        llm = make_llm(path, speculative_config={"method": "mtp", "num_speculative_tokens": 2},
                       enable_prefix_caching=False, **options)
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == expected, options
        assert len(proposals) > 10, options
        for known, drafts in proposals[::4]:
            assert drafts == reference.drafts(known, len(drafts)), (options, len(known))
