"""What the server reads from its engine, whichever kind it is: one
``LLMEngine``, or a ``DataParallelEngine`` whose replicas each have their own
scheduler, KV cache and prefix cache.

Invariants:

* ``take_snapshot`` talks to the engine, so only the engine thread calls it.
* A data-parallel engine's totals are combined from the very per-replica
  stats that are reported per replica (one question to each replica), so the
  two never disagree: counts (requests, free and total blocks, preemptions,
  prefix-cache tokens) are summed, KV usage is used blocks over all blocks.
* ``EngineCapacity`` sums over replicas: the server admits work for all of
  them together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from octavo.core.scheduler import SchedulerStats

if TYPE_CHECKING:
    from octavo.distributed.replica_stats import ReplicaStats


@dataclass(frozen=True)
class EngineCapacity:
    num_replicas: int
    num_kv_blocks: int  # all replicas together
    max_num_seqs: int  # sequences running at once, all replicas together
    scheduling_policy: str = "fcfs"  # "fcfs" or "priority" (core/request_queue.py)


@dataclass(frozen=True)
class EngineSnapshot:
    stats: SchedulerStats  # the whole engine (replicas combined)
    replicas: tuple[ReplicaStats, ...] = ()  # empty for a single engine


def is_data_parallel(engine) -> bool:
    """A front over replica processes (``DataParallelEngine``), even of one
    replica (``engine_process``): its stats come from the replicas."""
    return hasattr(engine, "get_replica_report")


def engine_capacity(engine) -> EngineCapacity:
    if is_data_parallel(engine):
        return EngineCapacity(
            num_replicas=engine.num_replicas,
            num_kv_blocks=sum(engine.replica_num_kv_blocks),
            max_num_seqs=engine.scheduler_config.max_num_seqs * engine.num_replicas,
            scheduling_policy=engine.scheduler_config.policy,
        )
    config = engine.scheduler.config
    return EngineCapacity(1, engine.scheduler.kv.num_blocks, config.max_num_seqs, config.policy)


def take_snapshot(engine) -> EngineSnapshot:
    """The engine's stats now (engine thread only)."""
    if not is_data_parallel(engine):
        return EngineSnapshot(engine.get_stats())
    from octavo.distributed.replica_stats import combine_replica_stats

    report = engine.get_replica_report()
    return EngineSnapshot(combine_replica_stats(report), tuple(report))
