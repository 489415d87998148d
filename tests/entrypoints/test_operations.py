"""Operations around the server, in process: request traces exported to an
OTLP receiver, request ids in JSON logs and responses, CORS off by default."""

from __future__ import annotations

import json
import logging
import time

import pytest

from octavo.core.outputs import CompletionOutput, PoolingOutput, PoolingRequestOutput, RequestMetrics, RequestOutput
from octavo.core.pooling_params import PoolingParams
from octavo.core.sampling_params import RequestOutputKind, SamplingParams
from octavo.entrypoints.logging_setup import REQUEST_ID, JsonFormatter
from octavo.entrypoints.tracing import traces_url
from tests.entrypoints.otlp_receiver import OtlpReceiver, attributes


@pytest.fixture
def receiver():
    pytest.importorskip("opentelemetry.sdk")
    receiver = OtlpReceiver()
    endpoint = receiver.start()
    yield receiver, endpoint
    receiver.stop()


def _output(request_id: str, token_ids: list[int], finished: bool, metrics: RequestMetrics) -> RequestOutput:
    completion = CompletionOutput(0, "x", token_ids, finish_reason="length" if finished else None)
    return RequestOutput(request_id, "hi", [5, 6, 7], [completion], finished, num_cached_tokens=2, metrics=metrics)


def test_a_finished_request_becomes_queue_prefill_and_decode_spans(receiver):
    from octavo.entrypoints.tracing import RequestTracer

    receiver, endpoint = receiver
    tracer = RequestTracer(endpoint)
    now = time.monotonic()
    metrics = RequestMetrics(arrival_time=now - 1.0, first_scheduled_time=now - 0.9, first_token_time=now - 0.6)
    params = SamplingParams(temperature=0.5, max_tokens=4, output_kind=RequestOutputKind.DELTA)
    tracer.on_request_added("cmpl-1", 3, params)
    tracer.on_outputs([_output("cmpl-1", [11, 12], False, metrics)])
    metrics.finished_time = now
    tracer.on_outputs([_output("cmpl-1", [13, 14], True, metrics)])
    tracer.on_request_added("cmpl-aborted", 3, params)
    tracer.on_request_aborted("cmpl-aborted")
    assert tracer.force_flush()
    tracer.shutdown()
    spans = {span.name: span for span in receiver.snapshot()}
    assert set(spans) == {"llm_request", "queue", "prefill", "decode"}
    root = spans["llm_request"]
    assert all(spans[name].parent_span_id == root.span_id for name in ("queue", "prefill", "decode"))
    assert all(spans[name].trace_id == root.trace_id for name in spans)
    info = attributes(root)
    assert info["gen_ai.request.id"] == "cmpl-1" and info["gen_ai.usage.input_tokens"] == 3
    assert info["gen_ai.usage.output_tokens"] == 4 and info["octavo.cached_tokens"] == 2
    assert info["gen_ai.response.finish_reasons"] == ["length"]
    assert attributes(spans["decode"])["gen_ai.usage.output_tokens"] == 4
    assert attributes(spans["prefill"])["gen_ai.usage.input_tokens"] == 3
    # The phases tile the request, in order, on the wall clock.
    assert root.start_time_unix_nano == spans["queue"].start_time_unix_nano
    assert spans["queue"].end_time_unix_nano == spans["prefill"].start_time_unix_nano
    assert spans["prefill"].end_time_unix_nano == spans["decode"].start_time_unix_nano
    assert spans["decode"].end_time_unix_nano == root.end_time_unix_nano
    assert abs(root.end_time_unix_nano / 1e9 - time.time()) < 60


def test_a_pooling_request_becomes_queue_and_prefill_spans(receiver):
    from octavo.entrypoints.tracing import RequestTracer

    receiver, endpoint = receiver
    tracer = RequestTracer(endpoint)
    now = time.monotonic()
    metrics = RequestMetrics(arrival_time=now - 1.0, first_scheduled_time=now - 0.4, finished_time=now)
    tracer.on_request_added("embd-1", 5, PoolingParams(task="embed"))
    tracer.on_outputs([PoolingRequestOutput("embd-1", "hi", [1, 2, 3, 4, 5], PoolingOutput.from_values([0.6, 0.8]), metrics=metrics)])
    assert tracer._pending == {}
    assert tracer.force_flush()
    tracer.shutdown()
    spans = {span.name: span for span in receiver.snapshot()}
    assert set(spans) == {"llm_request", "queue", "prefill"}
    root = spans["llm_request"]
    info = attributes(root)
    assert info["gen_ai.request.id"] == "embd-1" and info["octavo.task"] == "embed"
    assert info["gen_ai.usage.input_tokens"] == 5 and info["gen_ai.response.finish_reasons"] == ["stop"]
    assert attributes(spans["prefill"])["gen_ai.usage.input_tokens"] == 5
    assert spans["queue"].end_time_unix_nano == spans["prefill"].start_time_unix_nano
    assert spans["prefill"].end_time_unix_nano == root.end_time_unix_nano


def test_traces_url_defaults_the_path():
    assert traces_url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert traces_url("collector:4318") == "http://collector:4318/v1/traces"
    assert traces_url("https://c/custom/path") == "https://c/custom/path"


def test_json_log_lines_carry_the_request_id():
    record = logging.LogRecord("octavo.test", logging.INFO, __file__, 1, "hello %s", ("world",), None)
    token = REQUEST_ID.set("abc123")
    try:
        line = json.loads(JsonFormatter().format(record))
    finally:
        REQUEST_ID.reset(token)
    assert line["message"] == "hello world" and line["request_id"] == "abc123"
    assert line["level"] == "INFO" and line["logger"] == "octavo.test" and line["time"].endswith("Z")
    assert "request_id" not in json.loads(JsonFormatter().format(record))


def _app(allowed_origins: list[str]):
    from fastapi import FastAPI

    from octavo.entrypoints.logging_setup import current_request_id
    from octavo.entrypoints.openai.operations import OperationsConfig, install_operations

    app = FastAPI()

    @app.get("/v1/models")
    def models():
        logging.getLogger("octavo.test").info("listing models")
        return {"request_id": current_request_id()}

    install_operations(app, OperationsConfig(allowed_origins=allowed_origins))
    return app


class _JsonLines(logging.Handler):
    """Formats each record when it is logged (inside its request's context)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(JsonFormatter())
        self.lines: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))


def test_request_ids_reach_the_response_and_the_logs():
    from starlette.testclient import TestClient

    handler, logger = _JsonLines(), logging.getLogger("octavo.test")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with TestClient(_app([])) as client:
            first = client.get("/v1/models", headers={"X-Request-Id": "client-7"})
            second = client.get("/v1/models", headers={"X-Request-Id": "not an id!"})
    finally:
        logger.removeHandler(handler)
    assert first.headers["x-request-id"] == first.json()["request_id"]
    assert first.headers["x-request-id"] != second.headers["x-request-id"]
    assert [line["request_id"] for line in handler.lines] == [first.headers["x-request-id"], second.headers["x-request-id"]]
    assert handler.lines[0]["client_request_id"] == "client-7" and "client_request_id" not in handler.lines[1]


def test_cors_is_off_by_default_and_answers_preflight_when_on():
    from starlette.testclient import TestClient

    preflight = {"Origin": "https://ui.example", "Access-Control-Request-Method": "POST"}
    with TestClient(_app([])) as client:
        plain = client.get("/v1/models", headers={"Origin": "https://ui.example"})
        assert "access-control-allow-origin" not in plain.headers
        assert "access-control-allow-origin" not in client.options("/v1/models", headers=preflight).headers
    with TestClient(_app(["https://ui.example"])) as client:
        answer = client.options("/v1/models", headers=preflight)
        assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == "https://ui.example"
        other = client.options("/v1/models", headers={**preflight, "Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers
        assert client.get("/v1/models", headers={"Origin": "https://ui.example"}).headers["access-control-allow-origin"]


def test_an_engine_process_takes_the_servers_log_format(monkeypatch):
    from octavo.entrypoints.logging_setup import configure_logging, configure_process_logging

    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    monkeypatch.delenv("OCTAVO_LOG_LEVEL", raising=False)
    monkeypatch.delenv("OCTAVO_LOG_FORMAT", raising=False)
    try:
        configure_logging("info", "json")  # the server ...
        root.handlers.clear()
        configure_process_logging()  # ... and, from the environment it left, a spawned engine process
        assert isinstance(root.handlers[0].formatter, JsonFormatter) and root.level == logging.INFO
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
