"""Octavo's models against Hugging Face transformers, float32 on the CPU.

For each architecture: a batch of 8 prompts of different lengths, greedy,
32 new tokens: token ids identical to HF ``generate`` and the chosen tokens'
logprobs within 1e-4. Then the same outputs with chunked prefill forced,
with preemption forced and with prefix-cache hits.
"""

from __future__ import annotations

import random

import pytest

from octavo import SamplingParams
from tests.checkpoints import ARCHITECTURES
from tests.hf_reference import assert_tokens_match, hf_greedy

NUM_NEW_TOKENS = 32


def make_prompts(vocab_size: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = [3, 9, 16, 17, 31, 40, 5, 64]
    return [[rng.randrange(3, vocab_size) for _ in range(n)] for n in lengths]


def greedy(logprobs: int | None = 5) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True, logprobs=logprobs)


@pytest.fixture(scope="module")
def references(checkpoint_dirs):
    """HF's greedy outputs per architecture, computed once."""
    cache = {}

    def get(arch: str):
        if arch not in cache:
            path = checkpoint_dirs[arch]
            from octavo.models.config import load_arch_config

            vocab = load_arch_config(path).vocab_size
            prompts = make_prompts(vocab)
            cache[arch] = (prompts, [hf_greedy(path, p, NUM_NEW_TOKENS) for p in prompts])
        return cache[arch]

    return get


def check_against_hf(outputs, refs, logprob_tol: float = 1e-4) -> None:
    for output, ref in zip(outputs, refs):
        completion = output.outputs[0]
        top5 = [sorted(d, key=lambda t: d[t].rank)[:5] for d in completion.logprobs]
        assert_tokens_match(completion.token_ids, ref, top5)
        for step, (token_id, entry) in enumerate(zip(completion.token_ids, completion.logprobs)):
            if token_id != ref.token_ids[step]:
                break
            assert abs(entry[token_id].logprob - ref.logprobs[step]) < logprob_tol


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_matches_hf(arch, checkpoint_dirs, references, make_llm):
    prompts, refs = references(arch)
    llm = make_llm(checkpoint_dirs[arch])
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy())
    check_against_hf(outputs, refs)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_chunked_prefill_matches_hf(arch, checkpoint_dirs, references, make_llm):
    prompts, refs = references(arch)
    # A budget of 7 tokens splits every prompt over several steps.
    llm = make_llm(checkpoint_dirs[arch], max_num_batched_tokens=7)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy())
    check_against_hf(outputs, refs)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_preemption_matches_hf(arch, checkpoint_dirs, references, make_llm):
    prompts, refs = references(arch)
    # 14 blocks of 16 tokens: the longest request alone needs 6, so the batch
    # must preempt and recompute.
    llm = make_llm(checkpoint_dirs[arch], num_kv_blocks=14, enable_prefix_caching=False)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy())
    assert llm.engine.get_stats().num_preemptions > 0
    check_against_hf(outputs, refs)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_prefix_cache_hits_match_hf(arch, checkpoint_dirs, make_llm):
    path = checkpoint_dirs[arch]
    from octavo.models.config import load_arch_config

    vocab = load_arch_config(path).vocab_size
    shared = make_prompts(vocab, seed=1)[-1][:48]  # three full blocks
    prompts = [shared + tail for tail in ([5, 6, 7], [8, 9], [10, 11, 12, 13])]
    refs = [hf_greedy(path, p, NUM_NEW_TOKENS) for p in prompts]
    llm = make_llm(path)
    first = llm.generate([{"prompt_token_ids": prompts[0]}], greedy())
    rest = llm.generate([{"prompt_token_ids": p} for p in prompts[1:]], greedy())
    stats = llm.engine.get_stats().prefix_cache
    assert stats.num_hits >= 2 * 48
    assert all(o.num_cached_tokens == 48 for o in rest)
    check_against_hf(first + rest, refs)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_tracks_hf(dtype, llama_dir, make_llm):
    import torch

    from tests.hf_reference import hf_greedy

    from octavo.models.config import load_arch_config

    torch_dtype = getattr(torch, dtype)
    prompts = make_prompts(load_arch_config(llama_dir).vocab_size)[:4]
    llm = make_llm(llama_dir, dtype=dtype)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy())
    for prompt, output in zip(prompts, outputs):
        ref = hf_greedy(llama_dir, prompt, NUM_NEW_TOKENS, dtype=torch_dtype)
        completion = output.outputs[0]
        top5 = [sorted(d, key=lambda t: d[t].rank)[:5] for d in completion.logprobs]
        # Half precision: the first divergence must be a near-tie.
        assert_tokens_match(completion.token_ids, ref, top5)


def test_sliding_window_matches_hf(tmp_path, tokenizer_dir, make_llm):
    from tests.checkpoints import build_checkpoint

    from octavo.models.config import load_arch_config

    path = build_checkpoint(tmp_path / "mistral-sw", "mistral", tokenizer_dir, sliding_window=8)
    prompts = make_prompts(load_arch_config(path).vocab_size)[2:6]
    refs = [hf_greedy(path, p, 16) for p in prompts]
    llm = make_llm(path)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=5)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    check_against_hf(outputs, refs)
