"""Speculative decoding's counters (vLLM's ``spec_decode_*`` series) at scrape time.

The engine keeps cumulative totals (``SpecDecodingStats``); they are
rendered as they are from the snapshot the scrape took, in one API process
or several alike, so nothing is added twice. With speculative decoding off
there are no series.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from octavo.core.scheduler_config import SpecDecodingStats


class SpecDecodingCollector(Collector):
    def __init__(self) -> None:
        self._stats: SpecDecodingStats | None = None

    def update(self, stats: SpecDecodingStats | None) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats
        if stats is None:
            return
        yield CounterMetricFamily(
            "octavo:spec_decode_num_drafts", "Steps in which a request carried drafts", value=stats.num_drafts
        )
        yield CounterMetricFamily(
            "octavo:spec_decode_num_draft_tokens", "Draft tokens proposed", value=stats.num_draft_tokens
        )
        yield CounterMetricFamily(
            "octavo:spec_decode_num_accepted_tokens", "Draft tokens the model accepted", value=stats.num_accepted_tokens
        )
        per_position = CounterMetricFamily(
            "octavo:spec_decode_num_accepted_tokens_per_pos", "Accepted draft tokens by their position in the draft",
            labels=["position"],
        )
        for position, count in enumerate(stats.accepted_per_position):
            per_position.add_metric([str(position)], count)
        yield per_position
