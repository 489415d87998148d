"""Prometheus metrics for one server (one ``CollectorRegistry`` per app, never the global one).

Request-level metrics (tokens, TTFT, inter-token latency, end-to-end latency,
finish reasons) are recorded on the engine thread as outputs appear, from the
timestamps the output processor stamps on each sequence; engine-level gauges
(running and waiting requests, KV-cache usage and free blocks, prefix-cache
hit rate, preemptions, the platform's compilations, speculative decoding's
counters) are refreshed from the scheduler at scrape time. For a
data-parallel engine they are the replicas combined (``engine_stats``), and
``replica_metrics`` adds each replica's own, labelled ``replica``.
prometheus_client's metrics are thread-safe; the per-sequence bookkeeping
here is touched by the engine thread only.

With several API processes (``api_server_index`` set, and
``PROMETHEUS_MULTIPROC_DIR`` in the environment) each process records its
requests in prometheus_client's shared files and any one of them renders
all: request-level series are summed, engine gauges are the most recently
refreshed value (every process reads the same engine), and the engine's
cumulative counters come straight from the answering process's fresh
snapshot (``EngineTotals``), so nothing is counted once per process.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from octavo.core.outputs import CompletionOutput, PoolingRequestOutput, RequestMetrics, RequestOutput
from octavo.core.pooling_params import PoolingParams
from octavo.core.sampling_params import RequestOutputKind, SamplingParams
from octavo.core.scheduler_output import CompilationCounts
from octavo.entrypoints.engine_stats import EngineSnapshot
from octavo.entrypoints.engine_totals import ENGINE_COUNTERS, EngineTotals
from octavo.entrypoints.replica_metrics import ReplicaCollector
from octavo.entrypoints.spec_decode_metrics import SpecDecodingCollector

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 240.0, 480.0, 960.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class _SequenceTiming:
    num_seen_tokens: int = 0
    last_token_time: float | None = None


@dataclass
class _RequestProgress:
    delta: bool  # DELTA outputs carry new tokens only; the other kinds carry all so far
    num_tokens: dict[int, int] = field(default_factory=dict)  # choice index -> tokens counted
    # RequestMetrics.sequence_index -> timing. Not the object's id: outputs from
    # an engine process carry a new RequestMetrics object each time.
    timings: dict[int, _SequenceTiming] = field(default_factory=dict)
    first_token_seen: bool = False
    finished_indices: set[int] = field(default_factory=set)
    num_seqs: int = 1


class ServerMetrics:
    """Implements the async engine's ``EngineObserver`` and renders ``/metrics``."""

    def __init__(self, num_replicas: int = 1, api_server_index: int | None = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.multiprocess = api_server_index is not None
        self._api_server = str(api_server_index or 0)
        engine_gauge = {"multiprocess_mode": "mostrecent"}  # ignored by one process alone
        self.replicas: ReplicaCollector | None = None
        if num_replicas > 1:
            self.replicas = ReplicaCollector()
            r.register(self.replicas)
        self.num_running = Gauge("octavo:num_requests_running", "Requests running in the engine", registry=r, **engine_gauge)
        self.num_waiting = Gauge("octavo:num_requests_waiting", "Requests waiting to be scheduled", registry=r, **engine_gauge)
        self.num_inflight_seqs = Gauge(
            "octavo:num_inflight_sequences", "Sequences admitted by the server", registry=r, multiprocess_mode="livesum"
        )
        self.kv_usage = Gauge("octavo:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0 to 1)", registry=r, **engine_gauge)
        self.kv_free_blocks = Gauge("octavo:kv_cache_free_blocks", "Free KV-cache blocks", registry=r, **engine_gauge)
        self.kv_total_blocks = Gauge("octavo:kv_cache_total_blocks", "KV-cache blocks in all", registry=r, **engine_gauge)
        self.prefix_hit_rate = Gauge("octavo:prefix_cache_hit_rate", "Prefix-cache hits / queries (tokens)", registry=r, **engine_gauge)
        self.engine_totals: EngineTotals | None = None
        if self.multiprocess:
            self.engine_totals = EngineTotals()
        else:
            self.prefix_queries = Counter("octavo:prefix_cache_queries", ENGINE_COUNTERS["prefix_queries"], registry=r)
            self.prefix_hits = Counter("octavo:prefix_cache_hits", ENGINE_COUNTERS["prefix_hits"], registry=r)
            self.preemptions = Counter("octavo:num_preemptions", ENGINE_COUNTERS["preemptions"], registry=r)
            self.compilations = Counter("octavo:compilations", ENGINE_COUNTERS["compilations"], registry=r)
            self.compilations_after_warmup = Counter(
                "octavo:compilations_after_warmup", ENGINE_COUNTERS["compilations_after_warmup"], registry=r
            )
        self.spec_decoding = SpecDecodingCollector()
        r.register(self.spec_decoding)
        self.engine_alive = Gauge("octavo:engine_alive", "1 while the engine loop runs", registry=r, **engine_gauge)
        # vLLM's lora_requests_info: the labels carry the adapters, the value the time of the reading.
        self.lora_info = Gauge(
            "octavo:lora_requests_info", "LoRA adapters of the running and waiting requests (value: unix time)",
            ["max_lora", "running_lora_adapters", "waiting_lora_adapters"], registry=r, **engine_gauge,
        )
        self.max_loras = 0  # set by the app from the engine's limits; 0: LoRA off, no series
        self.engine_restarts = Counter("octavo:engine_restarts", "Engines rebuilt after a failure (--restart-engine)", registry=r)
        # The Responses API's store (one API process only: with several, nothing is stored).
        self.responses_stored = Gauge("octavo:responses_stored", "Responses kept for previous_response_id", registry=r,
                                      multiprocess_mode="livesum")
        self.responses_stored_bytes = Gauge("octavo:responses_stored_bytes", "Their JSON size (bytes)", registry=r,
                                            multiprocess_mode="livesum")
        self.responses_background = Gauge("octavo:responses_background_running", "Background responses running",
                                          registry=r, multiprocess_mode="livesum")
        self.api_server_requests = Counter(
            "octavo:api_server_requests", "Requests admitted, by API process (--api-server-count)", ["api_server"], registry=r
        )
        self.prompt_tokens = Counter("octavo:prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter("octavo:generation_tokens", "Generated tokens", registry=r)
        self.request_success = Counter(
            "octavo:request_success", "Finished sequences by finish reason", ["finished_reason"], registry=r
        )
        self.requests_rejected = Counter("octavo:requests_rejected", "Requests refused at admission", ["reason"], registry=r)
        self.request_failures = Counter(
            "octavo:request_failures", "Requests the server took and failed (5xx), by reason (failures.py)", ["reason"], registry=r
        )
        self.ttft = Histogram("octavo:time_to_first_token_seconds", "Time to first token", buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("octavo:inter_token_latency_seconds", "Time between tokens", buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram("octavo:e2e_request_latency_seconds", "Arrival to finish", buckets=E2E_BUCKETS, registry=r)
        self._requests: dict[str, _RequestProgress] = {}
        # The same token counts as plain numbers, for the periodic stats line (stats_log.py).
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0
        self._last_preemptions = 0
        self._last_compilations = CompilationCounts()
        self._last_prefix_queries = 0
        self._last_prefix_hits = 0

    # ------------------------------------------------- EngineObserver (engine thread)

    def on_request_added(self, request_id: str, num_prompt_tokens: int, params: SamplingParams | PoolingParams) -> None:
        self.prompt_tokens.inc(num_prompt_tokens)
        self.num_prompt_tokens += num_prompt_tokens
        self.api_server_requests.labels(api_server=self._api_server).inc()
        delta = isinstance(params, SamplingParams) and params.output_kind == RequestOutputKind.DELTA
        num_seqs = params.n if isinstance(params, SamplingParams) else 1
        self._requests[request_id] = _RequestProgress(delta=delta, num_seqs=num_seqs)
        if self.multiprocess:  # each process keeps its own share of the sum current
            self.num_inflight_seqs.inc(num_seqs)

    def on_outputs(self, outputs: list[RequestOutput | PoolingRequestOutput]) -> None:
        for output in outputs:
            progress = self._requests.get(output.request_id)
            if progress is None:
                continue
            if isinstance(output, PoolingRequestOutput):
                self._on_pooled(output)
                continue
            for completion in output.outputs:
                self._count_tokens(progress, completion)
            if output.metrics is not None:
                self._observe_latency(progress, output.metrics)
            if output.finished:
                metrics = output.metrics
                if metrics is not None and metrics.finished_time is not None:
                    self.e2e.observe(metrics.finished_time - metrics.arrival_time)
                self._forget(output.request_id)

    def _on_pooled(self, output: PoolingRequestOutput) -> None:
        """A pooling request: one final output, no tokens generated."""
        metrics = output.metrics
        if metrics is not None and metrics.finished_time is not None:
            self.e2e.observe(metrics.finished_time - metrics.arrival_time)
        self.request_success.labels(finished_reason=output.finish_reason).inc()
        self._forget(output.request_id)

    def on_request_aborted(self, request_id: str) -> None:
        if self._forget(request_id):
            self.request_success.labels(finished_reason="abort").inc()

    def on_engine_restarted(self) -> None:
        """A new engine: its cumulative counters start again from zero (called before its thread starts)."""
        self.engine_restarts.inc()
        self._requests.clear()
        self._last_preemptions = self._last_prefix_queries = self._last_prefix_hits = 0

    def _forget(self, request_id: str) -> bool:
        progress = self._requests.pop(request_id, None)
        if progress is not None and self.multiprocess:
            self.num_inflight_seqs.dec(progress.num_seqs)
        return progress is not None

    def _count_tokens(self, progress: _RequestProgress, completion: CompletionOutput) -> None:
        num_counted = progress.num_tokens.get(completion.index, 0)
        num_new = len(completion.token_ids) if progress.delta else len(completion.token_ids) - num_counted
        if num_new > 0:
            self.generation_tokens.inc(num_new)
            self.num_generation_tokens += num_new
            progress.num_tokens[completion.index] = num_counted + num_new
        if completion.finish_reason is not None and completion.index not in progress.finished_indices:
            progress.finished_indices.add(completion.index)
            self.request_success.labels(finished_reason=completion.finish_reason).inc()

    def _observe_latency(self, progress: _RequestProgress, metrics: RequestMetrics) -> None:
        """TTFT once per request; inter-token gaps per sequence whose timings the output carries.

        (A final-only output carries the timings of the sequence that finished
        last, so for ``n > 1`` its siblings' gaps are not observed.)
        """
        if not progress.first_token_seen and metrics.first_token_time is not None:
            progress.first_token_seen = True
            self.ttft.observe(metrics.first_token_time - metrics.arrival_time)
        timing = progress.timings.get(metrics.sequence_index)
        if timing is None:
            timing = progress.timings[metrics.sequence_index] = _SequenceTiming(last_token_time=metrics.first_token_time)
            timing.num_seen_tokens = 1 if metrics.first_token_time is not None else 0
        num_gaps = metrics.num_generation_tokens - timing.num_seen_tokens
        if num_gaps > 0 and metrics.last_token_time is not None and timing.last_token_time is not None:
            # Outputs that carry several tokens spread their time evenly over them.
            gap = (metrics.last_token_time - timing.last_token_time) / num_gaps
            for _ in range(num_gaps):
                self.itl.observe(gap)
        if metrics.first_token_time is not None:
            timing.num_seen_tokens = max(timing.num_seen_tokens, metrics.num_generation_tokens)
            timing.last_token_time = metrics.last_token_time

    # ------------------------------------------------------------ scrape (event loop)

    def update_engine_stats(self, snapshot: EngineSnapshot, alive: bool, num_inflight_seqs: int) -> None:
        stats = snapshot.stats
        self.num_running.set(stats.num_running)
        self.num_waiting.set(stats.num_waiting)
        if not self.multiprocess:
            self.num_inflight_seqs.set(num_inflight_seqs)
        self.kv_usage.set(stats.kv_cache_usage)
        self.kv_free_blocks.set(stats.num_free_blocks)
        self.engine_alive.set(1 if alive else 0)
        if self.max_loras:
            self.lora_info.clear()  # one series: the latest reading
            self.lora_info.labels(
                str(self.max_loras), ",".join(stats.running_lora_adapters), ",".join(stats.waiting_lora_adapters)
            ).set(time.time())
        self.spec_decoding.update(stats.spec_decoding)
        prefix = stats.prefix_cache
        self.prefix_hit_rate.set(prefix.hit_rate)
        if self.replicas is not None and snapshot.replicas:
            self.replicas.update(snapshot.replicas)
        if self.engine_totals is not None:
            self.engine_totals.update(stats)
            return
        self.prefix_queries.inc(max(0, prefix.num_queries - self._last_prefix_queries))
        self.prefix_hits.inc(max(0, prefix.num_hits - self._last_prefix_hits))
        self.preemptions.inc(max(0, stats.num_preemptions - self._last_preemptions))
        self._last_prefix_queries, self._last_prefix_hits = prefix.num_queries, prefix.num_hits
        self._last_preemptions = stats.num_preemptions
        compiled = stats.compilations
        self.compilations.inc(max(0, compiled.total - self._last_compilations.total))
        self.compilations_after_warmup.inc(max(0, compiled.after_warmup - self._last_compilations.after_warmup))
        self._last_compilations = compiled

    def update_response_store(self, num_stored: int, num_bytes: int, num_background: int) -> None:
        self.responses_stored.set(num_stored)
        self.responses_stored_bytes.set(num_bytes)
        self.responses_background.set(num_background)

    def render(self) -> bytes:
        if not self.multiprocess:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        registry.register(self.engine_totals)
        registry.register(self.spec_decoding)
        if self.replicas is not None:
            registry.register(self.replicas)
        return generate_latest(registry)
