"""The two JSON endpoints the dashboard polls (both need the key, like every data route).

``/ui/api/config``: the engine's configuration (model, dtype, platform,
attention backend, quantization, token budget, replicas).

``/ui/api/stats``: one sample of the server's Prometheus registry, the very
series ``/metrics`` renders, as JSON: gauges as they are, counters and
histogram buckets cumulative. The endpoint keeps no state; the page keeps the
last minutes of samples and derives rates (tokens/s), windowed hit rates and
percentiles (TTFT, inter-token latency) from the differences between samples,
as Prometheus' ``rate`` and ``histogram_quantile`` would.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import defaultdict

from fastapi import Request
from prometheus_client import CollectorRegistry

from octavo.entrypoints.engine_stats import engine_capacity, is_data_parallel
from octavo.entrypoints.openai.serving import get_context
from octavo.version import __version__

_PREFIX = "octavo:"
_REPLICA_PREFIX = "octavo:replica_"


async def config(request: Request) -> dict:
    ctx = get_context(request)
    engine = ctx.engine.engine
    scheduler_config = engine.scheduler_config if is_data_parallel(engine) else engine.scheduler.config
    capacity = engine_capacity(engine)
    # ModelInfo: path, architecture, dtype, platform, attention backends, quantization, parallel sizes.
    model = dataclasses.asdict(engine.info) if engine.info is not None else {}
    return {
        "version": __version__,
        "served_model_names": ctx.config.served_model_names,
        **model,
        "num_replicas": capacity.num_replicas,
        "max_model_len": ctx.limits.max_model_len,
        "max_num_batched_tokens": scheduler_config.max_num_batched_tokens,
        "max_num_seqs": scheduler_config.max_num_seqs,
        "enable_chunked_prefill": scheduler_config.enable_chunked_prefill,
        "block_size": ctx.limits.block_size,
        "num_kv_blocks": capacity.num_kv_blocks,
        "max_queued_requests": ctx.config.max_queued_requests,
    }


async def stats(request: Request) -> dict:
    ctx = get_context(request)
    snapshot = await ctx.engine.get_snapshot()
    ctx.metrics.update_engine_stats(snapshot, ctx.engine.is_alive, ctx.engine.num_inflight_seqs)
    return registry_sample(ctx.metrics.registry, time.time())


def registry_sample(registry: CollectorRegistry, now: float) -> dict:
    """``{"time", "series", "labelled", "histograms", "replicas"}`` from one collection.

    ``series``: unlabelled gauges and counters by short name (``octavo:`` and a
    counter's ``_total`` dropped); ``labelled``: ``{name: {label value: value}}``;
    ``histograms``: ``{name: {"le": [...], "counts": [...], "sum", "count"}}``
    (cumulative buckets, ``+Inf`` last as null); ``replicas``: one dict of
    short names per replica, in replica order.
    """
    series: dict[str, float] = {}
    labelled: dict[str, dict[str, float]] = defaultdict(dict)
    histograms: dict[str, dict] = {}
    replicas: dict[str, dict[str, float]] = defaultdict(dict)
    for family in registry.collect():
        if family.type == "histogram":
            histograms[_short(family.name)] = _histogram(family)
            continue
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            name = _short(sample.name)
            if family.name.startswith(_REPLICA_PREFIX):
                replicas[sample.labels["replica"]][name.removeprefix("replica_")] = sample.value
            elif sample.labels:
                (label_value,) = sample.labels.values()
                labelled[name][label_value] = sample.value
            else:
                series[name] = sample.value
    return {
        "time": now,
        "series": series,
        "labelled": dict(labelled),
        "histograms": histograms,
        "replicas": [replicas[key] for key in sorted(replicas, key=int)],
    }


def _short(name: str) -> str:
    return name.removeprefix(_PREFIX).removesuffix("_total")


def _histogram(family) -> dict:
    bounds: list[float | None] = []
    counts: list[float] = []
    total = count = 0.0
    for sample in family.samples:
        if sample.name.endswith("_bucket"):
            bound = float(sample.labels["le"])
            bounds.append(None if math.isinf(bound) else bound)  # JSON has no infinity
            counts.append(sample.value)
        elif sample.name.endswith("_sum"):
            total = sample.value
        elif sample.name.endswith("_count"):
            count = sample.value
    return {"le": bounds, "counts": counts, "sum": total, "count": count}
