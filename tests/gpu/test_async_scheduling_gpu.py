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
    assert run(fast, prompts, params_for(LENGTHS)) == expected
