"""Deny by default: every route of the app answers 401 without the key, except the
explicit allowlist (/health, /ping, /version, the web UI's pages and files); the key is checked for Bearer and, on
the Anthropic routes, x-api-key."""

from __future__ import annotations

import httpx
import pytest

from octavo.entrypoints.openai.app import build_app
from octavo.entrypoints.openai.config import PUBLIC_PATHS, ServerConfig
from octavo.entrypoints.ui.static_files import load_static_files, public_paths
from tests.entrypoints.server.conftest import API_KEY, MODEL_NAME

OPENAI_401 = {
    "error": {
        "message": "invalid or missing API key: send it as `Authorization: Bearer <key>`",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
}
ANTHROPIC_401 = {
    "type": "error",
    "error": {
        "type": "authentication_error",
        "message": "invalid or missing API key: send it as `Authorization: Bearer <key>`",
    },
}

# The stored-response routes answer 404 for an id never stored (after the key check).
UNKNOWN_RESPONSE = "resp_unknown"

# The web UI's pages and their files load without a key (they hold no data; tests/ui).
UI_PAGES_AND_FILES = public_paths(load_static_files())


@pytest.fixture(scope="module")
def app_routes(reference_llm):
    """(method, path) of every route the app defines, from ``app.routes`` (the app is never started)."""
    app = build_app(reference_llm.engine, ServerConfig(served_model_names=[MODEL_NAME], api_key="unused"))
    routes = []
    for route in app.routes:
        for method in sorted(getattr(route, "methods", None) or {"GET"}):
            path = route.path.replace("{model_id:path}", MODEL_NAME).replace("{response_id}", UNKNOWN_RESPONSE)
            assert "{" not in path, f"fill in the path parameters of {route.path}"
            routes.append((method, path))
    return routes


def test_the_walk_covers_the_api(app_routes):
    paths = {path for _, path in app_routes}
    expected = {"/v1/completions", "/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/models", "/health", "/metrics",
                "/tokenize", "/detokenize", "/version"}
    assert expected <= paths
    assert PUBLIC_PATHS == frozenset({"/health", "/version", "/ping"})


def test_every_route_needs_the_key(server, app_routes):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for method, path in app_routes:
            if method == "HEAD":
                continue
            for headers in ({}, {"Authorization": "Bearer wrong-key"}, {"Authorization": API_KEY}):
                response = client.request(method, path, headers=headers, json={})
                if path in PUBLIC_PATHS or path in UI_PAGES_AND_FILES:
                    assert response.status_code == 200, (method, path)
                    continue
                assert response.status_code == 401, (method, path, headers, response.text)
                assert response.headers["www-authenticate"] == "Bearer"
                expected = ANTHROPIC_401 if path.startswith("/v1/messages") else OPENAI_401
                assert response.json() == expected, (method, path)


def test_unknown_paths_need_the_key_too(server):
    for path in ("/v1/not-a-route", "/docs", "/openapi.json", "/admin"):
        assert httpx.get(server.url + path).status_code == 401


def test_the_key_opens_every_route(server, app_routes, auth_headers):
    with httpx.Client(base_url=server.url, timeout=60, headers=auth_headers) as client:
        for method, path in app_routes:
            if method == "GET":
                expected = 404 if UNKNOWN_RESPONSE in path else 200
                assert client.get(path).status_code == expected, path


def test_x_api_key_only_on_anthropic_routes(server):
    body = {"model": MODEL_NAME, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(base_url=server.url, timeout=60, headers={"x-api-key": API_KEY}) as client:
        assert client.post("/v1/messages", json=body).status_code == 200
        assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 401
        assert client.post("/v1/messages", json=body, headers={"x-api-key": "nope"}).status_code == 401


def test_clients_without_a_key_get_authentication_errors(server):
    import anthropic
    import openai

    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError) as caught:
            client.models.list()
    assert caught.value.body["code"] == "invalid_api_key"
    with anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0) as client:
        with pytest.raises(anthropic.AuthenticationError):
            client.messages.create(model=MODEL_NAME, max_tokens=2, messages=[{"role": "user", "content": "hi"}])
