"""What a data-parallel engine reports of its replicas: each replica's
scheduler stats with what the front routed to it (``ReplicaStats``, the
server's per-replica metrics and UI), and the whole engine's stats made of
them (``combine_replica_stats``)."""

from __future__ import annotations

from dataclasses import dataclass

from octavo.core.kv_cache_manager import PrefixCacheStats
from octavo.core.scheduler_config import SchedulerStats, SpecDecodingStats
from octavo.core.scheduler_output import CompilationCounts


@dataclass
class ReplicaStats:
    """One replica's scheduler stats, plus what the front routed to it."""

    replica: int
    scheduler: SchedulerStats
    num_kv_blocks: int
    num_requests_routed: int  # ever sent to this replica
    num_requests_finished: int  # ever finished there (stop, length or error; aborts are not counted)


def combine_replica_stats(replicas: list[ReplicaStats]) -> SchedulerStats:
    """The whole engine's stats: counts (requests, free blocks, preemptions,
    prefix-cache tokens) summed; KV usage is used blocks over all blocks."""
    stats = [r.scheduler for r in replicas]
    num_blocks = sum(r.num_kv_blocks for r in replicas)
    num_used_blocks = sum(s.kv_cache_usage * r.num_kv_blocks for s, r in zip(stats, replicas))
    prefix = PrefixCacheStats(
        num_queries=sum(s.prefix_cache.num_queries for s in stats),
        num_hits=sum(s.prefix_cache.num_hits for s in stats),
        num_requests=sum(s.prefix_cache.num_requests for s in stats),
    )
    return SchedulerStats(
        num_running=sum(s.num_running for s in stats),
        num_waiting=sum(s.num_waiting for s in stats),
        kv_cache_usage=num_used_blocks / num_blocks if num_blocks else 0.0,
        num_free_blocks=sum(s.num_free_blocks for s in stats),
        num_preemptions=sum(s.num_preemptions for s in stats),
        prefix_cache=prefix,
        compilations=CompilationCounts(
            total=sum(s.compilations.total for s in stats),
            after_warmup=sum(s.compilations.after_warmup for s in stats),
        ),
        running_lora_adapters=sorted({name for s in stats for name in s.running_lora_adapters}),
        waiting_lora_adapters=sorted({name for s in stats for name in s.waiting_lora_adapters}),
        spec_decoding=_combine_spec_decoding([s.spec_decoding for s in stats if s.spec_decoding is not None]),
    )


def _combine_spec_decoding(parts: list[SpecDecodingStats]) -> SpecDecodingStats | None:
    """The replicas' speculative-decoding counters summed (None with it off)."""
    if not parts:
        return None
    width = max(len(p.accepted_per_position) for p in parts)
    return SpecDecodingStats(
        num_drafts=sum(p.num_drafts for p in parts),
        num_draft_tokens=sum(p.num_draft_tokens for p in parts),
        num_accepted_tokens=sum(p.num_accepted_tokens for p in parts),
        accepted_per_position=[
            sum(p.accepted_per_position[i] for p in parts if i < len(p.accepted_per_position)) for i in range(width)
        ],
    )
