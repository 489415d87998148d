"""Per-replica series of a data-parallel server, labelled ``replica``.

The unlabelled ``octavo:*`` engine series are the replicas combined; these
give each replica's own. A custom collector renders the last engine snapshot
as it is: the replicas' counters are cumulative already, so nothing is
incremented twice, and one scrape shows one consistent snapshot.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from octavo.distributed.replica_stats import ReplicaStats

# (name, help, kind, value of one replica)
_SERIES = (
    ("octavo:replica_num_requests_running", "Requests running in the replica", "gauge",
     lambda r: r.scheduler.num_running),
    ("octavo:replica_num_requests_waiting", "Requests waiting in the replica", "gauge",
     lambda r: r.scheduler.num_waiting),
    ("octavo:replica_kv_cache_usage_perc", "Fraction of the replica's KV-cache blocks in use", "gauge",
     lambda r: r.scheduler.kv_cache_usage),
    ("octavo:replica_kv_cache_free_blocks", "Free KV-cache blocks of the replica", "gauge",
     lambda r: r.scheduler.num_free_blocks),
    ("octavo:replica_kv_cache_total_blocks", "KV-cache blocks of the replica", "gauge",
     lambda r: r.num_kv_blocks),
    ("octavo:replica_prefix_cache_queries", "Prompt tokens looked up in the replica's prefix cache", "counter",
     lambda r: r.scheduler.prefix_cache.num_queries),
    ("octavo:replica_prefix_cache_hits", "Prompt tokens found in the replica's prefix cache", "counter",
     lambda r: r.scheduler.prefix_cache.num_hits),
    ("octavo:replica_num_preemptions", "Requests preempted in the replica", "counter",
     lambda r: r.scheduler.num_preemptions),
    ("octavo:replica_requests_routed", "Requests routed to the replica", "counter",
     lambda r: r.num_requests_routed),
    ("octavo:replica_requests_finished", "Requests the replica finished (stop, length, error)", "counter",
     lambda r: r.num_requests_finished),
)


class ReplicaCollector(Collector):
    def __init__(self) -> None:
        self._replicas: tuple[ReplicaStats, ...] = ()

    def update(self, replicas: tuple[ReplicaStats, ...]) -> None:
        self._replicas = replicas

    def collect(self) -> Iterator[Metric]:
        replicas = self._replicas
        for name, text, kind, value_of in _SERIES:
            family_class = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
            family = family_class(name, text, labels=["replica"])
            for replica in replicas:
                family.add_metric([str(replica.replica)], value_of(replica))
            yield family
