"""Issue 14: no request can kill, hang or stall the server. Items 1 and 5, on the demo
model, with the engine in its own process and in the server's (``any_demo_server``).

Item 1: integers the engine cannot represent (a seed or a stop token id at 2**64, a top_k at
2**63) once killed the engine for good; now each is a 400 on every route and the engine
serves the next request. Item 5: +inf is refused, a request larger than the server ever
admits is a 400 (not a 503 to retry for ever), legacy echo with max_tokens 0 scores the
prompt, /v1/models names the model as the operator did, HEAD /health answers, and the
OpenAPI document is served behind the key.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.entrypoints.server.conftest import API_KEY, DEMO_MAX_MODEL_LEN, DEMO_MODEL

AUTH = {"Authorization": f"Bearer {API_KEY}"}
USER = [{"role": "user", "content": "What does a cow say?"}]
ROUTES = {
    "/v1/completions": {"prompt": "Once upon a time", "max_tokens": 2},
    "/v1/chat/completions": {"messages": USER, "max_tokens": 2},
    "/v1/messages": {"model": DEMO_MODEL, "messages": USER, "max_tokens": 2},
    "/v1/responses": {"model": DEMO_MODEL, "input": "What does a cow say?", "max_output_tokens": 2},
}
# Item 1's killers, per route that takes the field (the Anthropic route has no seed or stop token ids).
KILLERS = [
    ("seed", 2**64), ("seed", -(2**63) - 1), ("seed", 2**100),
    ("stop_token_ids", [2**64]), ("stop_token_ids", [2**63]), ("stop_token_ids", [5, 10**30]),
    ("top_k", 2**63), ("top_k", 2**64), ("n", 2**64), ("max_tokens", 2**64), ("min_tokens", 2**63),
    ("temperature", 1e999), ("repetition_penalty", 1e999), ("top_p", 1e999),
]
ANTHROPIC_FIELDS = {"max_tokens", "temperature", "top_p", "top_k"}
# The fields each route takes, where it is not all of them; the Responses API's max_tokens is max_output_tokens.
ROUTE_FIELDS = {"/v1/messages": ANTHROPIC_FIELDS,
                "/v1/responses": {"seed", "top_k", "max_tokens", "temperature", "repetition_penalty", "top_p"}}
RENAMED = {("/v1/responses", "max_tokens"): "max_output_tokens"}


def killers(route: str):
    for field, value in KILLERS:
        if field in ROUTE_FIELDS.get(route, {field}):
            yield RENAMED.get((route, field), field), value


def cases():
    for route, base in ROUTES.items():
        for field, value in killers(route):
            yield pytest.param(route, {**base, field: value}, id=f"{route.rsplit('/', 1)[-1]}-{field}={value!r:.12}")


def post(server, route: str, body: dict | str) -> httpx.Response:
    """``body`` as JSON (inf and nan as Infinity and NaN, as some clients send them), or as given."""
    content = body if isinstance(body, str) else json.dumps(body)
    return httpx.post(server.url + route, content=content, headers={**AUTH, "content-type": "application/json"}, timeout=60)


def assert_serving(server) -> None:
    """/health is 200 and a real generation goes through."""
    assert httpx.get(server.url + "/health", timeout=60).status_code == 200
    response = post(server, "/v1/completions", ROUTES["/v1/completions"])
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("route, body", list(cases()))
def test_unrepresentable_numbers_are_a_400_and_the_engine_lives(any_demo_server, route, body):
    response = post(any_demo_server, route, body)
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert "64-bit" in message or "less than or equal to" in message or "greater than or equal to" in message or (
        "finite" in message
    ), message


def test_the_engine_served_after_every_killer(any_demo_server):
    for route, base in ROUTES.items():
        for field, value in killers(route):
            post(any_demo_server, route, {**base, field: value})
    assert_serving(any_demo_server)


@pytest.mark.parametrize("field", ["temperature", "repetition_penalty"])
@pytest.mark.parametrize("literal", ["Infinity", "-Infinity", "NaN", "1e999"])
def test_infinities_are_refused(demo_server, field, literal):
    for route in ("/v1/completions", "/v1/chat/completions"):
        base = ROUTES[route]
        text = json.dumps(base)[:-1] + f', "{field}": {literal}}}'
        response = post(demo_server, route, text)
        assert response.status_code == 400, response.text
        assert response.json()["error"] == {
            "message": f"{field}: Input should be a finite number", "type": "invalid_request_error", "param": field,
            "code": "invalid_request_body",
        }


def test_stop_token_ids_outside_the_vocabulary(demo_server):
    from octavo.default_model import default_model_path

    vocab_size = json.loads((default_model_path() / "config.json").read_text())["vocab_size"]
    body = {**ROUTES["/v1/completions"], "stop_token_ids": [vocab_size]}
    response = post(demo_server, "/v1/completions", body)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == f"token id {vocab_size} is out of range for a vocabulary of {vocab_size}"
    assert response.json()["error"]["param"] == "stop_token_ids"


def test_too_long_errors_name_what_the_client_sent(demo_server):
    long_text = "once upon a time " * 400  # about 1,600 tokens: more than the 512 of the context
    chat = post(demo_server, "/v1/chat/completions", {"messages": [{"role": "user", "content": long_text}]})
    assert chat.status_code == 400
    error = chat.json()["error"]
    assert error["param"] == "messages" and "max_tokens" not in error["message"], error
    assert error["message"].startswith("the messages take ") and f"max_model_len is {DEMO_MAX_MODEL_LEN}" in error["message"]
    # A completion that sends no max_tokens is capped at the rest of the context, never refused for it.
    prompt = "Once upon a time " * 100
    response = post(demo_server, "/v1/completions", {"prompt": prompt, "ignore_eos": True})
    assert response.status_code == 200, response.text
    sent = post(demo_server, "/v1/completions", {"prompt": prompt, "max_tokens": DEMO_MAX_MODEL_LEN})
    assert sent.status_code == 400 and sent.json()["error"]["param"] == "max_tokens"


def test_prompt_size_is_checked_before_tokenising(demo_server):
    """The default character limit: no text longer than the context times the longest token can fit."""
    response = post(demo_server, "/v1/completions", {"prompt": "x" * 2_000_000})
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("the prompt is 2000000 characters long; the limit is ")
    chat = post(demo_server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 2_000_000}]})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages"
    assert_serving(demo_server)


def test_echo_with_max_tokens_zero_scores_the_prompt(demo_server):
    body = {"prompt": "Once upon a time", "max_tokens": 0, "echo": True, "logprobs": 1, "temperature": 0}
    response = post(demo_server, "/v1/completions", body)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["text"] == "Once upon a time"
    logprobs = choice["logprobs"]
    assert "".join(logprobs["tokens"]) == "Once upon a time"
    assert logprobs["token_logprobs"][0] is None and all(lp < 0 for lp in logprobs["token_logprobs"][1:])
    assert response.json()["usage"]["completion_tokens"] == 0
    streamed = httpx.post(demo_server.url + "/v1/completions", json={**body, "stream": True}, headers=AUTH, timeout=60)
    assert '"text":"Once upon a time"' in streamed.text and streamed.text.rstrip().endswith("data: [DONE]")
    no_echo = post(demo_server, "/v1/completions", {"prompt": "hi", "max_tokens": 0})
    assert no_echo.status_code == 400


def test_health_head_and_models(demo_server):
    head = httpx.head(demo_server.url + "/health", timeout=60)
    assert head.status_code == 200 and head.content == b""
    models = httpx.get(demo_server.url + "/v1/models", headers=AUTH, timeout=60).json()
    assert [(m["id"], m["root"]) for m in models["data"]] == [(DEMO_MODEL, DEMO_MODEL)]


def test_openapi_document_is_served_behind_the_key(demo_server):
    assert httpx.get(demo_server.url + "/openapi.json", timeout=60).status_code == 401
    document = httpx.get(demo_server.url + "/openapi.json", headers=AUTH, timeout=60).json()
    paths = document["paths"]
    assert {"/v1/completions", "/v1/chat/completions", "/v1/messages", "/tokenize", "/health"} <= set(paths)
    completions = paths["/v1/completions"]["post"]
    assert completions["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/CompletionRequest"
    }
    assert "text/event-stream" in completions["responses"]["200"]["content"]
    schemas = document["components"]["schemas"]
    assert schemas["CompletionRequest"]["properties"]["seed"]["anyOf"][0]["maximum"] == 2**63 - 1
    assert schemas["ChatCompletionRequest"]["properties"]["temperature"]["anyOf"][0] == {"type": "number"}
    assert paths["/health"]["get"]["security"] == []


DEEP = "[" * 3000 + "]" * 3000  # nested past Python's recursion limit


@pytest.mark.parametrize(
    "route, body",
    [
        ("/v1/chat/completions", {"max_tokens": 2, "messages": [
            *USER, {"role": "assistant", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": DEEP}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}),
        ("/v1/responses", {"model": DEMO_MODEL, "max_output_tokens": 2, "input": [
            {"type": "function_call", "name": "f", "call_id": "c1", "arguments": DEEP}]}),
        ("/v1/completions", {"prompt": "x", "max_tokens": 2, "structured_outputs": {"json": DEEP}}),
        ("/invocations", DEEP),
    ],
    ids=["tool-call-arguments", "function-call-arguments", "schema-text", "invocations-body"],
)
def test_json_nested_past_the_recursion_limit_is_a_400(demo_server, route, body):
    """JSON text inside a request (a tool call's arguments, a schema, SageMaker's
    whole body) nested deeper than Python's parser recurses was a 500."""
    response = post(demo_server, route, body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert_serving(demo_server)
