"""schemathesis against the served OpenAPI document, on the demo model with the engine in its
own process and in the server's: for every operation, bodies that follow the document and
bodies that break it, each answered without a 5xx, with a status, content type and body the
document declares (the response models are the contract the routes' dicts are held to),
schema-breaking bodies refused with a 4xx, and /health still 200 at the end.

Examples are bounded (``MAX_EXAMPLES`` per operation and mode), and generation is kept short
(``max_tokens`` at most ``MAX_NEW_TOKENS``, ``n`` at most 2), so the suite takes seconds.
"""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from octavo.core.sampling_params import INT64_MAX, INT64_MIN
from tests.entrypoints.server.conftest import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}
MAX_EXAMPLES = 8
MAX_NEW_TOKENS = 4
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def schema(any_demo_server):
    document = httpx.get(f"{any_demo_server.url}/openapi.json", headers=AUTH, timeout=60).json()
    # The routes accept unknown fields (as OpenAI's do) and ignore them; the fuzzer spends its
    # examples on the known ones instead of on random extra keys.
    for component in document["components"]["schemas"].values():
        if component.get("additionalProperties") is True:
            component["additionalProperties"] = False
    loaded = schemathesis.openapi.from_dict(document)
    loaded.config.base_url = any_demo_server.url
    return loaded


def operations(schema) -> list:
    return [result.ok() for result in schema.get_all_operations()]


def _in_schema_range(value) -> bool:
    """An integer inside the fields' documented range (int64). Outside it the value is a
    negative case's violation, which the server must refuse: clamping it would turn the
    case valid behind the fuzzer's back (``max_tokens`` of 2**63 sent as 4 once failed
    ``negative_data_rejection``)."""
    return isinstance(value, int) and not isinstance(value, bool) and INT64_MIN <= value <= INT64_MAX


def keep_short(body) -> None:
    """Valid but slow values (thousands of tokens, n of 128) are the load tests' business, not a fuzzer's."""
    if not isinstance(body, dict):
        return
    for field in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        if _in_schema_range(body.get(field)) and body[field] > MAX_NEW_TOKENS:
            body[field] = MAX_NEW_TOKENS
    if _in_schema_range(body.get("min_tokens")) and body["min_tokens"] > 0:
        body["min_tokens"] = 0
    for field in ("n", "best_of"):
        if _in_schema_range(body.get(field)) and body[field] > 2:
            body[field] = 2


def test_the_document_covers_every_route(schema):
    labels = {op.label for op in operations(schema)}
    assert {"POST /v1/completions", "POST /v1/chat/completions", "POST /v1/messages", "POST /v1/responses", "POST /tokenize",
            "POST /detokenize", "GET /v1/models", "GET /health", "HEAD /health", "GET /metrics"} <= labels


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/v1/messages", "/v1/responses"])
def test_streamed_answers_follow_the_documented_event_schema(schema, any_demo_server, path):
    # schemathesis reads a text/event-stream schema (OpenAPI < 3.2) as one event's: a stream once
    # failed the fuzzer when the document described the whole stream as a string.
    operation = next(op for op in operations(schema) if op.label == f"POST {path}")
    body = {"model": "octavo-demo", "max_tokens": 2, "stream": True}
    body.update({"prompt": "Hello"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "Hello"}]})
    if path == "/v1/responses":
        body = {"model": "octavo-demo", "max_output_tokens": 2, "stream": True, "input": "Hello"}
    case = operation.Case(body=body, media_type="application/json")
    response = case.call_and_validate(base_url=any_demo_server.url, headers=AUTH, checks=CHECKS, timeout=60)
    assert response.headers["content-type"][0].startswith("text/event-stream")
    events = response.text.strip().split("\n\n")
    ends = ("event: message_stop", "event: response.completed", "event: response.incomplete")  # Anthropic's, Responses'
    assert events[-1] == "data: [DONE]" or events[-1].startswith(ends)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["positive", "negative"])
def test_every_operation_keeps_its_contract(schema, any_demo_server, mode):
    negative = mode == GenerationMode.NEGATIVE
    checks = CHECKS + ([negative_data_rejection] if negative else [])
    for operation in operations(schema):
        if negative and (operation.method.upper() != "POST" or not operation.body):
            continue  # nothing to break: no body, no parameters but the served model's name or an id

        @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(generation_mode=mode))
        def check(case):
            keep_short(case.body)
            case.call_and_validate(base_url=any_demo_server.url, headers=AUTH, checks=checks, timeout=60)

        check()
    assert httpx.get(f"{any_demo_server.url}/health", timeout=60).status_code == 200
