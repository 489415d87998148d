"""vLLM's request fields for the engine, through the OpenAI routes: ``cache_salt``
separates prefix-cache hits (tenants), ``priority`` orders the queue and preempts
under ``--scheduling-policy priority``, and both are checked before admission.

The app runs in this process (the tiny Llama checkpoint) with one sequence slot,
so the order in which requests finish is the order the scheduler ran them; a
recording observer (the engine thread's metrics hook) sees that order."""

from __future__ import annotations

import threading

import pytest
from starlette.testclient import TestClient

from octavo import LLM
from octavo.entrypoints.openai.app import build_app
from octavo.entrypoints.openai.config import ServerConfig
from tests.entrypoints.server.conftest import MODEL_NAME, parse_metrics, wait_for

# Long enough that the requests sent after it are all queued while it runs.
BLOCKER_TOKENS = 24


class FinishOrder:
    """The metrics observer, plus the ids of finished requests in the order they finished."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.finished: list[str] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def on_outputs(self, outputs) -> None:
        self.finished += [output.request_id for output in outputs if output.finished]
        self.inner.on_outputs(outputs)


@pytest.fixture(scope="module")
def engine(llama_dir):
    llm = LLM(str(llama_dir), dtype="float32", max_model_len=128, num_kv_blocks=64, max_num_seqs=1,
              scheduling_policy="priority")
    yield llm.engine
    kv = llm.engine.scheduler.kv
    llm.engine.shutdown()
    assert kv.num_free_blocks == kv.num_blocks


@pytest.fixture(scope="module")
def client(engine):
    app = build_app(engine, ServerConfig(served_model_names=[MODEL_NAME]))
    with TestClient(app) as client:
        client.app_state = app.state.octavo
        yield client


def complete(client, prompt: str, max_tokens: int, **fields) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0, **fields}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def engine_gauge(client, name: str) -> float:
    return parse_metrics(client.get("/metrics").text)[name]


def in_thread(results: dict, key, call) -> threading.Thread:
    thread = threading.Thread(target=lambda: results.__setitem__(key, call()))
    thread.start()
    return thread


def wait_until_queued(client, running: int, waiting: int) -> None:
    wait_for(lambda: (engine_gauge(client, "octavo:num_requests_running"),
                      engine_gauge(client, "octavo:num_requests_waiting")) == (running, waiting))


def test_priority_orders_the_queue_and_preempts(client):
    recorder = FinishOrder(client.app_state.engine.observer)
    client.app_state.engine.observer = recorder
    try:
        # Waiting requests run lowest priority value first once the slot frees.
        results: dict = {}
        threads = [in_thread(results, "blocker", lambda: complete(client, "hold the slot", BLOCKER_TOKENS))]
        wait_until_queued(client, running=1, waiting=0)
        for priority in (3, 1, 2):
            threads.append(in_thread(results, priority, lambda p=priority: complete(client, f"p{p}", 2, priority=p)))
        wait_until_queued(client, running=1, waiting=3)
        for thread in threads:
            thread.join()
        assert recorder.finished == [results[key]["id"] for key in ("blocker", 1, 2, 3)]

        # A waiting request of a lower value preempts the running one for its slot.
        recorder.finished.clear()
        threads = [in_thread(results, "low", lambda: complete(client, "low", BLOCKER_TOKENS, priority=5))]
        wait_until_queued(client, running=1, waiting=0)
        threads.append(in_thread(results, "urgent", lambda: complete(client, "urgent", 2, priority=0)))
        for thread in threads:
            thread.join()
        assert recorder.finished == [results["urgent"]["id"], results["low"]["id"]]
        assert results["low"]["usage"]["completion_tokens"] == BLOCKER_TOKENS  # resumed, not cut short
    finally:
        client.app_state.engine.observer = recorder.inner


def test_cache_salt_separates_prefix_hits(client):
    prompt = "a system prompt of a few blocks " * 2  # the byte-level tokenizer: ~2 tokens a word

    def hits_after(**fields) -> float:
        before = engine_gauge(client, "octavo:prefix_cache_hits_total")
        complete(client, prompt, 1, **fields)
        return engine_gauge(client, "octavo:prefix_cache_hits_total") - before

    assert hits_after(cache_salt="tenant-a") == 0  # first of its salt
    assert hits_after(cache_salt="tenant-a") > 0  # same salt: its blocks are reused
    assert hits_after(cache_salt="tenant-b") == 0  # another tenant sees no hit
    assert hits_after() == 0  # nor does a request without a salt
    assert hits_after() > 0


@pytest.mark.parametrize(
    ("fields", "param"),
    [({"cache_salt": ""}, "cache_salt"), ({"cache_salt": 7}, "cache_salt"), ({"priority": "high"}, "priority"),
     ({"priority": 2**63}, "priority")],
)
def test_bad_request_options_are_400s(client, fields, param):
    body = {"prompt": "hi", "max_tokens": 1, **fields}
    for path, extra in (("/v1/completions", {}), ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
        response = client.post(path, json={**body, **extra})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == param


def test_priority_needs_the_priority_policy(llama_dir, make_llm):
    llm = make_llm(llama_dir, num_kv_blocks=16)  # fcfs
    with TestClient(build_app(llm.engine, ServerConfig(served_model_names=[MODEL_NAME]))) as client:
        response = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                              "max_tokens": 1, "priority": 1})
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "priority"
        assert "--scheduling-policy priority" in response.json()["error"]["message"]
        assert complete(client, "hi", 1, priority=0)["choices"][0]["finish_reason"] == "length"
