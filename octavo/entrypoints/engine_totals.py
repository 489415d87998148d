"""The engine's cumulative counters as Prometheus counters, read from one
snapshot at scrape time (for servers of several API processes).

One API process alone turns the engine's totals into counter increments
(``ServerMetrics``). Several would each add the same totals, so there the
answering process renders the totals as they are, from the snapshot it just
took: every API process reads the same engine, and nothing is added twice.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from octavo.core.scheduler import SchedulerStats

ENGINE_COUNTERS = {
    "prefix_queries": "Prompt tokens looked up in the prefix cache",
    "prefix_hits": "Prompt tokens found in the prefix cache",
    "preemptions": "Requests preempted for lack of KV blocks",
    "compilations": "Programs the platform compiled (XLA, torch.compile), warm-up included",
    "compilations_after_warmup": "Programs compiled after warm-up (steady state should add none)",
}


class EngineTotals(Collector):
    def __init__(self) -> None:
        self._stats: SchedulerStats | None = None

    def update(self, stats: SchedulerStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats
        if stats is None:
            return
        values = (
            ("octavo:prefix_cache_queries", "prefix_queries", stats.prefix_cache.num_queries),
            ("octavo:prefix_cache_hits", "prefix_hits", stats.prefix_cache.num_hits),
            ("octavo:num_preemptions", "preemptions", stats.num_preemptions),
            ("octavo:compilations", "compilations", stats.compilations.total),
            ("octavo:compilations_after_warmup", "compilations_after_warmup", stats.compilations.after_warmup),
        )
        for name, key, value in values:
            yield CounterMetricFamily(name, ENGINE_COUNTERS[key], value=value)
