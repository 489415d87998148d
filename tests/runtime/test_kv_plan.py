"""The KV-cache planner: what a byte budget holds beside what is allocated.

Issue 17's "twice the 4k sequences" figure must come from the budget: with
``max_num_seqs=1`` the allocation is capped at one ``max_model_len``
sequence whatever the KV dtype, so it hid the fp8 cache's 2x.
"""

from __future__ import annotations

import torch

from octavo.runtime.kv_plan import plan_kv_cache


def test_plan_caps_the_allocation_not_the_capacity():
    plan = plan_kv_cache(budget_bytes=10_000, bytes_per_block=100, block_size=16, max_num_seqs=1, max_model_len=320)
    assert plan.budget_blocks == 100 and plan.num_blocks == 20  # one 320-token sequence uses 20 blocks
    assert plan.budget_tokens == 1600
    assert plan.sequences_fit(64) == 25 and plan.sequences_fit(65) == 20  # whole blocks per sequence


def test_half_the_bytes_per_block_doubles_the_capacity():
    bf16 = plan_kv_cache(1 << 30, 2 * 4096, 16, 1, 32768)
    fp8 = plan_kv_cache(1 << 30, 4096, 16, 1, 32768)
    assert fp8.budget_blocks == 2 * bf16.budget_blocks and fp8.num_blocks == bf16.num_blocks
    assert fp8.sequences_fit(4096) == 2 * bf16.sequences_fit(4096)


def test_engine_fp8_cache_holds_twice_the_bf16_blocks(checkpoint_dirs, make_llm):
    """Same budget, bf16 model: the fp8 cache's plan holds 2x the blocks (the
    planner sizes by the KV dtype), even where max_num_seqs caps both allocations."""
    path, budget = checkpoint_dirs["llama"], 1 << 20
    runners = {}
    for kv_dtype in ("auto", "fp8"):
        llm = make_llm(path, dtype="bfloat16", kv_cache_dtype=kv_dtype, kv_cache_memory_bytes=budget, max_num_seqs=1)
        runners[kv_dtype] = llm.engine.executor.worker.runner
    bf16, fp8 = runners["auto"], runners["fp8"]
    assert {c.dtype for c in bf16.kv_caches} == {torch.bfloat16}
    assert {c.dtype for c in fp8.kv_caches} == {torch.float8_e4m3fn}
    assert fp8.kv_plan.bytes_per_block * 2 == bf16.kv_plan.bytes_per_block
    assert fp8.kv_plan.budget_blocks == 2 * bf16.kv_plan.budget_blocks
    assert fp8.num_kv_blocks == bf16.num_kv_blocks == 256 // 16  # both capped at one 256-token sequence
