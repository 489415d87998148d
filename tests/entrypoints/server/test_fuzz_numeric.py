"""Property tests (hypothesis) over every numeric field of every route, with extreme values,
against the demo model served with the engine in its own process and in the server's.

Every answer is a 2xx (the value is valid) or a 4xx with the API's error object, never a 5xx;
/health is 200 after each. A 4xx comes within ``REFUSAL_DEADLINE_S`` (1 s): refusals are
decided in the API process before any engine work, so even a loaded 2-core CI machine
answers them in milliseconds, and a second is a bound for "did not hang", not a benchmark.
A 2xx runs the model (one token), which on such a machine can wait behind other
processes for the CPU; it gets ``ANSWER_DEADLINE_S``.

Each (field, extreme value) pair is tried on its own first (a sweep, so none is left to
chance), then hypothesis combines several extreme fields in one request. Very long lists
(100,000 elements) go into the list fields (prompt token ids, stop token ids, tokens).
"""

from __future__ import annotations

import json
import math
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.entrypoints.server.conftest import API_KEY, DEMO_MODEL

REFUSAL_DEADLINE_S = 1.0
ANSWER_DEADLINE_S = 10.0
LONG = 100_000
INT64_MAX = 2**63 - 1

INTS = [0, -1, 2**31, INT64_MAX, 2**63, 2**64, -(2**63) - 1]
FLOATS = [1e308, -1e308, 5e-324, math.inf, -math.inf, math.nan]
SCALARS = INTS + FLOATS

USER = [{"role": "user", "content": "What does a cow say?"}]
BASES = {
    "/v1/completions": {"prompt": "Once upon a time", "max_tokens": 1},
    "/v1/chat/completions": {"messages": USER, "max_tokens": 1},
    "/v1/messages": {"model": DEMO_MODEL, "messages": USER, "max_tokens": 1},
    "/v1/responses": {"model": DEMO_MODEL, "input": "What does a cow say?", "max_output_tokens": 1},
    "/detokenize": {"tokens": [5, 6]},
}
SAMPLING = ["n", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
            "repetition_penalty", "seed", "min_tokens", "max_tokens"]
# Numeric fields, and list fields whose elements are numbers ("name[]": the value goes in a list).
FIELDS = {
    "/v1/completions": [*SAMPLING, "logprobs", "best_of", "stop_token_ids[]", "prompt[]"],
    "/v1/chat/completions": [*SAMPLING, "max_completion_tokens", "top_logprobs", "stop_token_ids[]"],
    "/v1/messages": ["max_tokens", "temperature", "top_p", "top_k"],
    "/v1/responses": ["temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                      "repetition_penalty", "seed", "max_output_tokens", "top_logprobs", "max_tool_calls"],
    "/detokenize": ["tokens[]"],
}


FLOAT_FIELDS = {"temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"}


def must_refuse(field: str, value) -> bool:
    """Values the API can never accept: a non-finite float, an integer field given a float or an
    integer outside int64, a token id below 0 (lists: any such element)."""
    if isinstance(value, list):
        return any(must_refuse(field, v) for v in value) or not field.endswith("[]")
    if field.rstrip("[]") in FLOAT_FIELDS:
        return isinstance(value, float) and not math.isfinite(value)
    if isinstance(value, float):
        return True
    low = 0 if field.endswith("[]") else -(2**63)
    return not low <= value <= INT64_MAX


def extremes_for(field: str) -> list:
    """The scalars; for a list field also a very long list, for a number field a list in its place."""
    return SCALARS + ([[0] * LONG, [2**64] * 3] if field.endswith("[]") else [[1]])


def with_field(route: str, field: str, value) -> dict:
    body = dict(BASES[route])
    if field.endswith("[]"):
        body[field[:-2]] = value if isinstance(value, list) else [value]
    else:
        body[field] = value
    return body


@pytest.fixture(scope="module")
def client(any_demo_server):
    headers = {"Authorization": f"Bearer {API_KEY}", "content-type": "application/json"}
    with httpx.Client(base_url=any_demo_server.url, headers=headers, timeout=60) as client:
        yield client


def probe(client: httpx.Client, route: str, body: dict) -> httpx.Response:
    content = json.dumps(body)  # inf and nan go out as Infinity and NaN, as some clients send them
    started = time.monotonic()
    response = client.post(route, content=content)
    elapsed = time.monotonic() - started
    shown = content[:200]
    assert response.status_code < 500, (shown, response.text)
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"], (shown, response.text)
        assert elapsed < REFUSAL_DEADLINE_S, (shown, elapsed)
    else:
        assert elapsed < ANSWER_DEADLINE_S, (shown, elapsed)
    health = client.get("/health")
    assert health.status_code == 200, (shown, health.text)
    return response


@pytest.mark.parametrize("route", list(FIELDS))
def test_each_field_with_each_extreme(client, route):
    for field in FIELDS[route]:
        for value in extremes_for(field):
            response = probe(client, route, with_field(route, field, value))
            if must_refuse(field, value):
                assert 400 <= response.status_code < 500, (route, field, str(value)[:40])


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions", "/v1/messages", "/v1/responses"])
def test_extreme_fields_combined(client, route):
    value = st.sampled_from(SCALARS)

    @settings(max_examples=12, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.fixed_dictionaries({}, optional={field: value for field in FIELDS[route]}))
    def check(extremes):
        body = dict(BASES[route])
        for field, v in extremes.items():
            body.update(with_field(route, field, v) if field.endswith("[]") else {field: v})
        response = probe(client, route, body)
        if any(must_refuse(field, v) for field, v in extremes.items()):
            assert 400 <= response.status_code < 500

    check()
