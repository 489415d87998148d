"""OpenTelemetry traces of requests (``--otlp-traces-endpoint``), exported
over OTLP/HTTP (protobuf) with the OpenTelemetry SDK (``octavo[otel]``).

Each finished request becomes one trace: an ``llm_request`` span from its
arrival to its end, with three children from the timestamps the engine
stamps on every request (``RequestMetrics``): ``queue`` (arrival to first
scheduled), ``prefill`` (to the first token; prompt and cached token counts)
and ``decode`` (to the end; generated token count). A pooling request
(embeddings, scores, classification) has ``queue`` and ``prefill`` (the one
step that computes and pools it, to its end) and no ``decode``; its root
carries ``octavo.task``. Spans are made when the
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

from octavo.core.outputs import PoolingRequestOutput, RequestOutput
from octavo.core.pooling_params import PoolingParams
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
    params: SamplingParams | PoolingParams
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

    def on_request_added(self, request_id: str, num_prompt_tokens: int, params: SamplingParams | PoolingParams) -> None:
        self._pending[request_id] = _Pending(num_prompt_tokens, params)

    def on_outputs(self, outputs: list[RequestOutput | PoolingRequestOutput]) -> None:
        for output in outputs:
            pending = self._pending.get(output.request_id)
            if pending is None:
                continue
            if isinstance(output, PoolingRequestOutput):  # always final
                del self._pending[output.request_id]
                if output.metrics is not None:
                    self._emit_pooled(output, pending)
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
        metrics, params = output.metrics, pending.params
        end = metrics.finished_time or metrics.last_token_time or time.monotonic()
        root_attributes = {
            "gen_ai.request.n": params.n,
            "gen_ai.request.temperature": params.temperature,
            "gen_ai.request.top_p": params.top_p,
            "gen_ai.request.max_tokens": params.max_tokens or 0,
            "gen_ai.usage.output_tokens": pending.num_output_tokens,
            "gen_ai.response.finish_reasons": [c.finish_reason or "" for c in output.outputs],
            "octavo.cached_tokens": output.num_cached_tokens,
        }
        phases = (
            ("queue", metrics.arrival_time, metrics.first_scheduled_time, {}),
            ("prefill", metrics.first_scheduled_time, metrics.first_token_time, {
                "gen_ai.usage.input_tokens": pending.num_prompt_tokens,
                "octavo.cached_tokens": output.num_cached_tokens,
            }),
            ("decode", metrics.first_token_time, end, {"gen_ai.usage.output_tokens": pending.num_output_tokens}),
        )
        self._emit_spans(output.request_id, pending, metrics.arrival_time, end, root_attributes, phases)

    def _emit_pooled(self, output: PoolingRequestOutput, pending: _Pending) -> None:
        metrics = output.metrics
        end = metrics.finished_time or time.monotonic()
        root_attributes = {"octavo.task": pending.params.task, "gen_ai.response.finish_reasons": [output.finish_reason]}
        phases = (
            ("queue", metrics.arrival_time, metrics.first_scheduled_time, {}),
            ("prefill", metrics.first_scheduled_time, end, {"gen_ai.usage.input_tokens": pending.num_prompt_tokens}),
        )
        self._emit_spans(output.request_id, pending, metrics.arrival_time, end, root_attributes, phases)

    def _emit_spans(self, request_id: str, pending: _Pending, start: float, end: float, root_attributes, phases) -> None:
        """The ``llm_request`` root from ``start`` to ``end`` (engine monotonic
        times) and one child per phase that has both its timestamps."""
        from opentelemetry import trace

        offset_ns = time.time_ns() - time.monotonic_ns()

        def wall_ns(monotonic: float) -> int:
            return int(monotonic * 1e9) + offset_ns

        attributes = {"gen_ai.request.id": request_id, "gen_ai.usage.input_tokens": pending.num_prompt_tokens}
        root = self.tracer.start_span("llm_request", start_time=wall_ns(start), attributes={**attributes, **root_attributes})
        parent = trace.set_span_in_context(root)
        for name, phase_start, stop, phase_attributes in phases:
            if phase_start is not None and stop is not None:
                span = self.tracer.start_span(name, context=parent, start_time=wall_ns(phase_start), attributes=phase_attributes)
                span.end(end_time=wall_ns(stop))
        root.end(end_time=wall_ns(end))

    def force_flush(self) -> bool:
        return self.provider.force_flush()

    def shutdown(self) -> None:
        self.provider.shutdown()
