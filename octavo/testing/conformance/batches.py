"""Attention scenarios: a few steps of mixed batches, run through two backends.

A scenario is what the model runner would feed one attention layer over
several engine steps, with random q/k/v:

* step 1: two prefills (one of them only a first chunk);
* step 2: a decode, a request whose first two blocks are a prefix-cache hit
  on another request's blocks, the next chunk of the chunked prefill and a
  fresh prefill;
* step 3: a profiling step, every slot negative (nothing may be written);
* step 4: every request decodes one token, which reads everything written
  before (so a corrupted cache shows up here).

Block ids are a random permutation (block tables are not contiguous). Each
backend runs the scenario against its own KV cache (allocated from its own
``kv_cache_shape``); outputs are compared step by step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from octavo.core.attention import AttentionBackend, AttentionBatch, AttentionSpec

NUM_BLOCKS = 32


@dataclass
class RequestPlan:
    block_ids: list[int]
    num_computed_tokens: int = 0


@dataclass
class StepPlan:
    scheduled: dict[str, int]  # request -> tokens computed this step
    write_kv: bool = True  # False: every slot negative (a profiling step)


@dataclass
class Scenario:
    spec: AttentionSpec
    requests: dict[str, RequestPlan]
    steps: list[StepPlan]
    seed: int = 0
    num_blocks: int = NUM_BLOCKS
    inputs: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=list)


def mixed_scenario(spec: AttentionSpec, seed: int = 0) -> Scenario:
    block_size = spec.block_size
    generator = torch.Generator().manual_seed(seed)
    blocks = torch.randperm(NUM_BLOCKS, generator=generator).tolist()

    def take(n: int) -> list[int]:
        return [blocks.pop() for _ in range(n)]

    a_blocks = take(4)
    requests = {
        "a": RequestPlan(a_blocks),
        # b shares a's first two (full) blocks: a prefix-cache hit.
        "b": RequestPlan(a_blocks[:2] + take(2), num_computed_tokens=2 * block_size),
        "c": RequestPlan(take(3)),
        "d": RequestPlan(take(2)),
    }
    steps = [
        StepPlan({"a": 2 * block_size + 5, "c": block_size + 4}),
        StepPlan({"a": 1, "b": 9, "c": 5, "d": 3}),
        StepPlan({"a": 3, "d": 2}, write_kv=False),
        StepPlan({"a": 1, "b": 1, "c": 1, "d": 1}),
    ]
    return Scenario(spec, requests, steps, seed)


def _step_batch(scenario: Scenario, step: StepPlan, device: torch.device) -> AttentionBatch:
    block_size = scenario.spec.block_size
    slots, query_start, seq_lens, tables = [], [0], [], []
    for request_id, num_new in step.scheduled.items():
        plan = scenario.requests[request_id]
        start = plan.num_computed_tokens
        for position in range(start, start + num_new):
            slot = plan.block_ids[position // block_size] * block_size + position % block_size
            slots.append(slot if step.write_kv else -1)
        query_start.append(query_start[-1] + num_new)
        seq_lens.append(start + num_new)
        tables.append(plan.block_ids)
    width = max(len(t) for t in tables)
    block_table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    query_start_t = torch.tensor(query_start, dtype=torch.int32)
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32)
    return AttentionBatch(
        query_start_loc=query_start_t.to(device),
        seq_lens=seq_lens_t.to(device),
        block_table=block_table.to(device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        num_reqs=len(seq_lens),
        num_actual_tokens=len(slots),
        max_query_len=max(step.scheduled.values()),
        max_seq_len=max(seq_lens),
        query_start_loc_cpu=query_start_t,
        seq_lens_cpu=seq_lens_t,
    )


def _random_inputs(scenario: Scenario, num_tokens: int, step_index: int, dtype: torch.dtype, input_dtype: torch.dtype):
    spec = scenario.spec
    generator = torch.Generator().manual_seed(scenario.seed * 1000 + step_index)

    def rand(heads: int) -> torch.Tensor:
        # Rounded to ``input_dtype`` first, so that a float32 reference sees
        # exactly the values a bfloat16 backend sees.
        return torch.randn(num_tokens, heads, spec.head_size, generator=generator).to(input_dtype).to(dtype)

    return rand(spec.num_heads), rand(spec.num_kv_heads), rand(spec.num_kv_heads)


@dataclass
class RotaryInputs:
    """Rotate q and k first: through ``forward_with_rotary`` with ``op`` (the
    fused path), or, when ``op`` is None, with the reference rotary then ``forward``."""

    cos_sin_cache: torch.Tensor  # float32 [max_position, head_size], on the CPU
    op: Callable | None = None


def _step_positions(scenario: Scenario, step: StepPlan) -> torch.Tensor:
    positions = []
    for request_id, num_new in step.scheduled.items():
        start = scenario.requests[request_id].num_computed_tokens
        positions.extend(range(start, start + num_new))
    return torch.tensor(positions, dtype=torch.int64)


def _attend(backend, query, key, value, kv_cache, metadata, positions, rotary: RotaryInputs | None):
    if rotary is None:
        return backend.forward(query, key, value, kv_cache, metadata)
    cos_sin = rotary.cos_sin_cache.to(query.device)
    if rotary.op is None:
        from octavo.ops.reference import rotary_embedding

        query, key = rotary_embedding(positions, query, key, cos_sin)
        return backend.forward(query, key, value, kv_cache, metadata)
    return backend.forward_with_rotary(query, key, value, kv_cache, metadata, positions, cos_sin, rotary.op)


def run_scenario(
    scenario: Scenario,
    backend: AttentionBackend,
    device: torch.device,
    input_dtype: torch.dtype | None = None,
    rotary: RotaryInputs | None = None,
) -> list[torch.Tensor]:
    """Each step's attention output (moved to the CPU, float32) from ``backend``.

    q/k/v are drawn in ``input_dtype`` (default: the backend's dtype) and
    handed to the backend in its own dtype; with ``rotary``, q and k are
    rotated at the tokens' positions first."""
    spec = backend.spec
    kv_cache = torch.zeros(backend.kv_cache_shape(scenario.num_blocks), dtype=spec.kv_cache_dtype, device=device)
    computed = {rid: plan.num_computed_tokens for rid, plan in scenario.requests.items()}
    outputs = []
    try:
        for index, step in enumerate(scenario.steps):
            batch = _step_batch(scenario, step, device)
            inputs = _random_inputs(scenario, batch.num_actual_tokens, index, spec.dtype, input_dtype or spec.dtype)
            query, key, value = (t.to(device) for t in inputs)
            metadata = backend.build_metadata(batch)
            positions = _step_positions(scenario, step).to(device)
            out = _attend(backend, query, key, value, kv_cache, metadata, positions, rotary)
            outputs.append(out.to("cpu", torch.float32))
            if step.write_kv:
                for request_id, num_new in step.scheduled.items():
                    scenario.requests[request_id].num_computed_tokens += num_new
    finally:
        for request_id, start in computed.items():
            scenario.requests[request_id].num_computed_tokens = start
    return outputs
