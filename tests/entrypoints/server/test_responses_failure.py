"""A Responses stream whose engine fails mid-answer ends with an ``error``
event and ``response.failed`` (status failed, the error's code), at once;
the engine restarts (``--restart-engine``) and the route answers again."""

from __future__ import annotations

import json

import httpx

from tests.entrypoints.server.conftest import API_KEY, read_metrics, wait_for
from tests.entrypoints.server.test_engine_restart import restarted

AUTH = {"Authorization": f"Bearer {API_KEY}"}
BODY = {"input": "Tell me a long story about a fox.", "max_output_tokens": 400, "stream": True, "store": False}


def test_a_failed_engine_ends_the_stream_with_response_failed(demo_server_inproc, demo_fault_file):
    before = read_metrics(demo_server_inproc, AUTH).get("octavo:engine_restarts_total", 0)
    events = []
    try:
        with httpx.Client(base_url=demo_server_inproc.url, headers=AUTH, timeout=120) as client:
            with client.stream("POST", "/v1/responses", json=BODY) as response:
                assert response.status_code == 200
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        events.append(json.loads(line[len("data: "):]))
                        if events[-1]["type"] == "response.output_text.delta" and not demo_fault_file.exists():
                            demo_fault_file.write_text("now")
    finally:
        demo_fault_file.unlink(missing_ok=True)
    error, failed = events[-2:]
    assert error["type"] == "error" and error["code"] == "engine_dead", error
    assert failed["type"] == "response.failed" and failed["response"]["status"] == "failed"
    assert failed["response"]["error"]["code"] == "engine_dead"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    wait_for(lambda: restarted(demo_server_inproc, before + 1))
    answer = httpx.post(f"{demo_server_inproc.url}/v1/responses", json={"input": "Hi", "max_output_tokens": 2},
                        headers=AUTH, timeout=60)
    assert answer.status_code == 200 and answer.json()["status"] in ("completed", "incomplete"), answer.text
