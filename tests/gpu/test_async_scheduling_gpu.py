"""On a CUDA GPU: async scheduling (pinned asynchronous copies, events,
decode and prefill graphs) gives the synchronous engine's outputs for every
sampling parameter, with chunked prefill and preemption. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

from tests.models.test_hf_parity import make_prompts
from tests.runtime.test_async_scheduling import params_for, run
from tests.runtime.test_decode_overlap import vocab

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

LENGTHS = [12, 20, 7, 16, 18, 9, 14, 5]


@pytest.mark.parametrize("tight", [False, True])
def test_async_matches_sync_on_the_gpu(llama_dir, make_llm, tight):
    prompts = make_prompts(vocab(llama_dir))
    options = dict(platform="cuda")
    if tight:
        options.update(num_kv_blocks=14, max_num_batched_tokens=24, enable_prefix_caching=False)
    expected = run(make_llm(llama_dir, overlap_decode=False, **options), prompts, params_for(LENGTHS))
    fast = make_llm(llama_dir, async_scheduling=True, **options)
    assert fast.engine.executor.worker.runner.graphs is not None
    got = run(fast, prompts, params_for(LENGTHS))
    assert got == expected, describe_differences(got, expected)


FIELDS = ("token_ids", "finish_reason", "text", "logprobs", "prompt_logprobs")


def describe_differences(got: list, expected: list) -> str:
    """Which request and which field differ, with both values (first differing position)."""
    lines = []
    for index, (ours, theirs) in enumerate(zip(got, expected)):
        for name, a, b in zip(FIELDS, ours, theirs):
            if a == b:
                continue
            if isinstance(a, list) and isinstance(b, list):
                at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                a, b = f"[{at}] {a[at:at + 2]} (len {len(a)})", f"[{at}] {b[at:at + 2]} (len {len(b)})"
            lines.append(f"request {index} {name}: async {a} | sync {b}")
    return "\n".join(lines)


def test_sampling_never_waits_for_the_device():
    """``Sampler.sample`` with every parameter at once launches its work
    without one host sync (CUDA's sync debug mode raises on any)."""
    from octavo import SamplingParams
    from octavo.runtime.sampler import Sampler, SamplingRow
    from tests.runtime.test_async_scheduling import MIXED

    vocab_size, device = 512, torch.device("cuda")
    rows = [
        SamplingRow(SamplingParams(max_tokens=8, **params), list(range(3, 40)), 30, frozenset({1}))
        for params in MIXED
    ]
    logits = torch.randn(len(rows), vocab_size, device=device)
    sampler = Sampler(seed=0, pin_memory=True)
    sampler.sample(logits, rows)  # warm-up: allocations, generators
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        sampled = sampler.sample(logits, rows)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    token_ids, logprobs = sampled.to_host()
    assert len(token_ids) == len(rows) and logprobs[5] is not None
