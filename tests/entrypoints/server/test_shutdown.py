"""SIGTERM: stop accepting, let requests in flight finish for --shutdown-timeout seconds, abort
the rest (their clients get an error chunk and [DONE]), and exit with status 0."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.entrypoints.server.conftest import wait_for
from tests.entrypoints.server.server_process import ServerProcess

MAX_MODEL_LEN = 4096
ARGS = ["--max-model-len", str(MAX_MODEL_LEN), "--num-kv-blocks", "1024"]


@pytest.fixture(scope="module")
def servers(llama_dir, tmp_path_factory):
    """Two servers, started together: a patient one (60 s to drain) and an impatient one (0 s)."""
    root = tmp_path_factory.mktemp("shutdown")
    patient = ServerProcess(llama_dir, [*ARGS, "--shutdown-timeout", "60"], root / "patient.log")
    impatient = ServerProcess(llama_dir, [*ARGS, "--shutdown-timeout", "0"], root / "impatient.log")
    for server in (patient, impatient):
        server.wait_healthy()
    yield patient, impatient
    for server in (patient, impatient):
        server.stop()


def stop_accepting(server: ServerProcess) -> bool:
    """True once the server refuses new requests (connection refused, or a 503 while draining)."""
    try:
        return httpx.get(f"{server.url}/health", timeout=10).status_code == 503
    except httpx.TransportError:
        return True


def data_events(lines) -> list[str]:
    return [line[len("data: "):] for line in lines if line.startswith("data: ")]


def test_sigterm_drains_requests_in_flight(servers):
    patient, _ = servers
    body = {"prompt": "Once upon a time", "max_tokens": 300, "ignore_eos": True, "stream": True, "temperature": 0}
    with httpx.Client(base_url=patient.url, timeout=120) as client:
        with client.stream("POST", "/v1/completions", json=body) as response:
            lines = response.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            patient.terminate()
            wait_for(lambda: stop_accepting(patient))
            events = [first[len("data: "):], *data_events(lines)]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all("error" not in chunk for chunk in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert patient.wait(timeout=120) == 0
    assert "SIGTERM: draining" in patient.log()


def test_sigterm_aborts_what_cannot_finish_in_time(servers):
    _, impatient = servers
    body = {"prompt": "Once upon a time", "max_tokens": MAX_MODEL_LEN - 100, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=impatient.url, timeout=120) as client:
        with client.stream("POST", "/v1/completions", json=body) as response:
            lines = response.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            impatient.terminate()
            events = data_events(lines)
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2]) == {
        "error": {
            "message": "the server shut down before this request finished",
            "type": "server_shutting_down",
            "param": None,
            "code": "server_shutting_down",
        }
    }
    assert impatient.wait(timeout=120) == 0
