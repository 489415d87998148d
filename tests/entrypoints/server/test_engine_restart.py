"""Issue 14, item 1: when the engine does die, requests in flight fail at once, later ones get
a fast 503 while it is down, and ``--restart-engine`` brings it back (counted in /metrics),
with the engine in the server's process (a model step that raises) and in its own (the
replica process killed)."""

from __future__ import annotations

import json
import os
import re
import signal

import httpx

from tests.entrypoints.server.conftest import API_KEY, read_metrics, wait_for

AUTH = {"Authorization": f"Bearer {API_KEY}"}
LONG = {"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True, "stream": True}
SHORT = {"prompt": "Once upon a time", "max_tokens": 2}


def stream_until_failure(server, fail) -> list[str]:
    """Start a long stream, call ``fail()`` after its first chunk, return its events."""
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=120) as client:
        with client.stream("POST", "/v1/completions", json=LONG) as response:
            assert response.status_code == 200
            events = []
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(line[len("data: "):])
                    if len(events) == 1:
                        fail()
    return events


def assert_failed_at_once(events: list[str]) -> None:
    """The stream ended with the engine's error and [DONE], long before its 400 tokens."""
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "engine_dead" and error["message"].endswith("it is restarting"), error
    assert len(events) < 100


def restarted(server, num_restarts: int) -> bool:
    if httpx.get(f"{server.url}/health", timeout=30).status_code != 200:
        return False
    return read_metrics(server, AUTH).get("octavo:engine_restarts_total", 0) >= num_restarts


def test_a_failed_model_step_restarts_the_engine(demo_server_inproc, demo_fault_file):
    before = read_metrics(demo_server_inproc, AUTH).get("octavo:engine_restarts_total", 0)
    try:
        assert_failed_at_once(stream_until_failure(demo_server_inproc, lambda: demo_fault_file.write_text("now")))
        # While the model keeps failing, every request fails fast with 503: refused while the
        # engine restarts, or failed by the next death.
        for _ in range(3):
            response = httpx.post(f"{demo_server_inproc.url}/v1/completions", json=SHORT, headers=AUTH, timeout=30)
            assert response.status_code == 503 and response.json()["error"]["code"] == "engine_dead", response.text
        health = httpx.get(f"{demo_server_inproc.url}/health", timeout=30)
        assert health.status_code in (200, 503)
    finally:
        demo_fault_file.unlink(missing_ok=True)
    wait_for(lambda: restarted(demo_server_inproc, before + 1))
    response = httpx.post(f"{demo_server_inproc.url}/v1/completions", json=SHORT, headers=AUTH, timeout=60)
    assert response.status_code == 200, response.text


def replica_pids(server) -> list[int]:
    return [int(pid) for pid in re.findall(r"engine replica 0 started in its own process \(pid (\d+)\)", server.log())]


def test_a_killed_engine_process_is_restarted(demo_server):
    before = read_metrics(demo_server, AUTH).get("octavo:engine_restarts_total", 0)
    (pid, *_) = replica_pids(demo_server)[-1:]
    assert_failed_at_once(stream_until_failure(demo_server, lambda: os.kill(pid, signal.SIGKILL)))
    down = httpx.post(f"{demo_server.url}/v1/completions", json=SHORT, headers=AUTH, timeout=30)
    assert down.status_code == 503 and down.json()["error"]["code"] == "engine_dead"
    wait_for(lambda: restarted(demo_server, before + 1))
    assert replica_pids(demo_server)[-1] != pid  # a new engine process
    response = httpx.post(f"{demo_server.url}/v1/completions", json=SHORT, headers=AUTH, timeout=60)
    assert response.status_code == 200, response.text
