"""SageMaker's contract (vLLM's): ``/ping`` answers like ``/health`` without a
key, and ``POST /invocations`` runs the generation route the body's shape
asks for, answering what that route answers."""

from __future__ import annotations

import httpx

from tests.entrypoints.server.conftest import API_KEY, MODEL_NAME

AUTH = {"Authorization": f"Bearer {API_KEY}"}
MESSAGES = [{"role": "user", "content": "Where is the river?"}]


def post(server, path: str, body) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers=AUTH, timeout=60)


def test_invocations_run_the_route_the_body_asks_for(server):
    greedy = {"model": MODEL_NAME, "temperature": 0}
    for body, path, text in (
        ({**greedy, "messages": MESSAGES, "max_tokens": 6}, "/v1/chat/completions", lambda r: r["choices"][0]["message"]["content"]),
        ({**greedy, "prompt": "Once upon a time", "max_tokens": 6}, "/v1/completions", lambda r: r["choices"][0]["text"]),
        ({**greedy, "input": "Once upon a time", "max_output_tokens": 6, "store": False}, "/v1/responses",
         lambda r: r["output"][0]["content"][0]["text"]),
    ):
        invoked, direct = post(server, "/invocations", body), post(server, path, body)
        assert invoked.status_code == direct.status_code == 200, invoked.text
        assert text(invoked.json()) == text(direct.json())
    bad = post(server, "/invocations", {"model": MODEL_NAME, "max_tokens": 2})
    assert bad.status_code == 400 and "messages, prompt, input" in bad.json()["error"]["message"]
    assert post(server, "/invocations", {"messages": MESSAGES, "temperature": "hot"}).json()["error"]["param"] == "temperature"
    assert httpx.post(f"{server.url}/invocations", content=b"{", headers=AUTH, timeout=60).status_code == 400
    assert httpx.post(f"{server.url}/invocations", json={"prompt": "x"}, timeout=60).status_code == 401


def test_ping_is_health_without_a_key(server):
    for method in ("GET", "POST"):
        response = httpx.request(method, f"{server.url}/ping", timeout=60)
        assert response.status_code == 200 and response.json() == {"status": "ok"}
