"""OpenTelemetry traces of requests (``--otlp-traces-endpoint``), exported
over OTLP/HTTP (protobuf) with the OpenTelemetry SDK (``octavo[otel]``).

Each finished request becomes one trace: an ``llm_request`` span from its
arrival to its end, with three children from the timestamps the engine
stamps on every request (``RequestMetrics``): ``queue`` (arrival to first
scheduled), ``prefill`` (to the first token; prompt and cached token counts)
and ``decode`` (to the end; generated token count). Spans are made when the
request finishes, on the engine thread, and exported in batches off it; an
aborted request has no end timestamps and makes no trace. Times are the
engine's monotonic clock moved onto the wall clock (one host: the engine
process and the server share the clock).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from octavo.core.outputs import RequestOutput
from octavo.core.sampling_params import RequestOutputKind, SamplingParams

TRACER_NAME = "octavo"


def traces_url(endpoint: str) -> str:
    """``endpoint`` as the OTLP/HTTP traces URL: a bare host:port gets ``/v1/traces``."""
    if "://" not in endpoint:
        endpoint = f"http://{endpoint}"
    if urlparse(endpoint).path in ("", "/"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"
    return endpoint


@dataclass
class _Pending:
    num_prompt_tokens: int
    params: SamplingParams
    num_output_tokens: int = 0


class RequestTracer:
    """An ``EngineObserver`` that turns each finished request into spans."""

    def __init__(self, endpoint: str, service_name: str = "octavo", exporter: Any = None) -> None:
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:
            from octavo.errors import OctavoError

            raise OctavoError(f"--otlp-traces-endpoint needs the otel extra ({exc.name} is missing): pip install 'octavo[otel]'")
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(endpoint=traces_url(endpoint))
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer(TRACER_NAME)
        self._pending: dict[str, _Pending] = {}  # engine thread only

    # ------------------------------------------------- EngineObserver (engine thread)

    def on_request_added(self, request_id: str, num_prompt_tokens: int, params: SamplingParams) -> None:
        self._pending[request_id] = _Pending(num_prompt_tokens, params)

    def on_outputs(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            pending = self._pending.get(output.request_id)
            if pending is None:
                continue
            num_tokens = sum(len(c.token_ids) for c in output.outputs)
            if pending.params.output_kind == RequestOutputKind.DELTA:
                pending.num_output_tokens += num_tokens
            else:
                pending.num_output_tokens = num_tokens
            if output.finished:
                del self._pending[output.request_id]
                if output.metrics is not None:
                    self._emit(output, pending)

    def on_request_aborted(self, request_id: str) -> None:
        self._pending.pop(request_id, None)

    # ------------------------------------------------------------------ spans

    def _emit(self, output: RequestOutput, pending: _Pending) -> None:
        from opentelemetry import trace

        metrics, params = output.metrics, pending.params
        offset_ns = time.time_ns() - time.monotonic_ns()

        def wall_ns(monotonic: float) -> int:
            return int(monotonic * 1e9) + offset_ns

        end = metrics.finished_time or metrics.last_token_time or time.monotonic()
        root = self.tracer.start_span(
            "llm_request",
            start_time=wall_ns(metrics.arrival_time),
            attributes={
                "gen_ai.request.id": output.request_id,
                "gen_ai.request.n": params.n,
                "gen_ai.request.temperature": params.temperature,
                "gen_ai.request.top_p": params.top_p,
                "gen_ai.request.max_tokens": params.max_tokens or 0,
                "gen_ai.usage.input_tokens": pending.num_prompt_tokens,
                "gen_ai.usage.output_tokens": pending.num_output_tokens,
                "gen_ai.response.finish_reasons": [c.finish_reason or "" for c in output.outputs],
                "octavo.cached_tokens": output.num_cached_tokens,
            },
        )
        parent = trace.set_span_in_context(root)
        phases = (
            ("queue", metrics.arrival_time, metrics.first_scheduled_time, {}),
            ("prefill", metrics.first_scheduled_time, metrics.first_token_time, {
                "gen_ai.usage.input_tokens": pending.num_prompt_tokens,
                "octavo.cached_tokens": output.num_cached_tokens,
            }),
            ("decode", metrics.first_token_time, end, {"gen_ai.usage.output_tokens": pending.num_output_tokens}),
        )
        for name, start, stop, attributes in phases:
            if start is not None and stop is not None:
                span = self.tracer.start_span(name, context=parent, start_time=wall_ns(start), attributes=attributes)
                span.end(end_time=wall_ns(stop))
        root.end(end_time=wall_ns(end))

    def force_flush(self) -> bool:
        return self.provider.force_flush()

    def shutdown(self) -> None:
        self.provider.shutdown()
