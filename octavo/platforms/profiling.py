"""Sizing the KV cache from a profiled dummy step.

``profile_run`` pushes the largest step the scheduler can produce through the
loaded model: ``max_num_batched_tokens`` tokens (split into sequences no
longer than ``max_model_len``, at most ``max_num_seqs`` of them), then the
logits and a float32 log-softmax for one row per sequence, as the sampler
would. Every token's slot is negative, which backends read as "do not write
KV", so a one-block scratch cache per layer is enough and nothing real is
touched. Each sequence has no cached context: a step's activations are
largest when all its tokens are new.

``profile_kv_cache_budget`` turns that into a byte budget:
``total * utilization - (memory outside torch's allocator) - (torch peak)``.
Memory outside the allocator (driver context, other processes) is measured
before and after the run and the larger value counts, so a shared device is
never oversubscribed.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import torch

from octavo.core.attention import AttentionBatch
from octavo.models.layers.attention import ForwardContext

logger = logging.getLogger(__name__)


class DeviceMemoryApi(Protocol):
    """The part of ``torch.cuda`` (and ``torch.xpu``, ``torch.npu``, ``torch.hpu``) used here."""

    def mem_get_info(self) -> tuple[int, int]: ...

    def memory_reserved(self) -> int: ...

    def max_memory_allocated(self) -> int: ...

    def reset_peak_memory_stats(self) -> None: ...

    def empty_cache(self) -> None: ...

    def synchronize(self) -> None: ...


def _profile_sequence_lengths(config: Any) -> list[int]:
    num_tokens = min(config.max_num_batched_tokens, config.max_num_seqs * config.max_model_len)
    lengths = []
    while num_tokens > 0:
        lengths.append(min(num_tokens, config.max_model_len))
        num_tokens -= lengths[-1]
    return lengths


def _profile_batch(lengths: list[int], block_size: int, device: torch.device) -> AttentionBatch:
    num_tokens = sum(lengths)
    query_start_loc = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    max_blocks = -(-max(lengths) // block_size)
    return AttentionBatch(
        query_start_loc=query_start_loc.to(device),
        seq_lens=seq_lens.to(device),
        # Every block id 0: reads hit the one scratch block, which is enough
        # to exercise the same shapes as a real step.
        block_table=torch.zeros(len(lengths), max_blocks, dtype=torch.int32, device=device),
        slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64, device=device),
        num_reqs=len(lengths),
        num_actual_tokens=num_tokens,
        max_query_len=max(lengths),
        max_seq_len=max(lengths),
        query_start_loc_cpu=query_start_loc,
        seq_lens_cpu=seq_lens,
    )


def profile_run(runner: Any) -> None:
    """One dummy step of the largest size through ``runner``'s model, writing no KV
    (under the platform's grad mode)."""
    with runner.platform.grad_mode():
        _profile_step(runner)
    runner.platform.end_step()


def _profile_step(runner: Any) -> None:
    config, loaded, device = runner.config, runner.loaded, runner.device
    largest_image = getattr(runner.model, "largest_image", None)
    if largest_image is not None:  # the vision tower's activations at the largest image count too
        runner.model.image_embeddings(torch.zeros(largest_image(), device=device))
    lengths = _profile_sequence_lengths(config)
    kv_caches = [torch.empty(0, device=device)] * loaded.arch.num_hidden_layers
    for index, backend in loaded.layer_backends_by_index.items():
        kv_caches[index] = torch.zeros(backend.kv_cache_shape(1), dtype=backend.spec.kv_cache_dtype, device=device)
    batch = _profile_batch(lengths, config.block_size, device)
    metadata = loaded.metadata_builder.build_metadata(batch)
    num_tokens = batch.num_actual_tokens
    input_ids = torch.zeros(num_tokens, dtype=torch.int64, device=device)
    positions = torch.cat([torch.arange(n, device=device) for n in lengths])
    hidden = runner.model(input_ids, positions, ForwardContext(attn_metadata=metadata, kv_caches=kv_caches))
    if loaded.pooler is not None:
        return  # a pooling model samples nothing; its pooled rows are small
    last_rows = batch.query_start_loc[1:].to(torch.long) - 1
    logits = runner.model.compute_logits(hidden[last_rows])
    torch.log_softmax(logits.to(torch.float32), dim=-1)


def profile_kv_cache_budget(runner: Any, utilization: float, memory: DeviceMemoryApi) -> int:
    """Bytes the KV cache may take on this device after ``profile_run``."""
    memory.synchronize()
    memory.empty_cache()
    memory.reset_peak_memory_stats()
    free_before, total = memory.mem_get_info()
    outside_before = total - free_before - memory.memory_reserved()
    profile_run(runner)
    memory.synchronize()
    peak = memory.max_memory_allocated()
    free_after, _ = memory.mem_get_info()
    outside_after = total - free_after - memory.memory_reserved()
    memory.empty_cache()
    outside = max(outside_before, outside_after, 0)
    budget = int(total * utilization) - outside - peak
    logger.info(
        "KV cache budget: %.2f GiB = %.2f GiB x %.2f - %.2f GiB outside torch - %.2f GiB torch peak",
        budget / 2**30,
        total / 2**30,
        utilization,
        outside / 2**30,
        peak / 2**30,
    )
    return max(budget, 0)
