"""vLLM's request fields for the engine, through the OpenAI routes: ``cache_salt``
separates prefix-cache hits (tenants), ``priority`` orders the queue and preempts
under ``--scheduling-policy priority``, and both are checked before admission.

The app runs in this process (the tiny Llama checkpoint) with one sequence slot,
so the order in which requests finish is the order the scheduler ran them. The
engine thread's observer (its metrics hook) records that order, and can hold
the engine thread after a step until the test has queued what it needs: no
race with the engine's speed."""

from __future__ import annotations

import json
import threading

import pytest
from starlette.testclient import TestClient

from octavo import LLM
from octavo.entrypoints.openai.app import build_app
from octavo.entrypoints.openai.config import ServerConfig
from tests.entrypoints.server.conftest import MODEL_NAME, parse_metrics, wait_for

LONG = 8  # tokens of the requests that hold the slot


class Recorder:
    """The metrics observer, plus the ids of finished requests in the order they
    finished; after ``hold(prompt)`` it holds the engine thread after the first
    step that runs that prompt, until ``resume`` is set."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.finished: list[str] = []
        self.held_prompt: str | None = None
        self.paused = threading.Event()
        self.resume = threading.Event()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def on_outputs(self, outputs) -> None:
        self.finished += [output.request_id for output in outputs if output.finished]
        self.inner.on_outputs(outputs)
        if any(output.prompt == self.held_prompt and not output.finished for output in outputs):
            self.held_prompt = None
            self.paused.set()
            self.resume.wait(120)

    def hold(self, prompt: str) -> None:
        self.paused.clear()
        self.resume.clear()
        self.held_prompt = prompt


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


def stream(client, prompt: str, max_tokens: int, **fields) -> dict:
    """A streamed completion (outputs every step, so the engine can be held mid-request): its id and usage."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **fields}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    chunks = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
    return {"id": chunks[0]["id"], "usage": chunks[-1]["usage"]}


def engine_counter(client, name: str) -> float:
    return parse_metrics(client.get("/metrics").text)[name]


def in_thread(results: dict, key, call) -> threading.Thread:
    thread = threading.Thread(target=lambda: results.__setitem__(key, call()))
    thread.start()
    return thread


def run_behind(client, recorder: Recorder, first: tuple, then: list[tuple]) -> dict:
    """Stream ``first`` (key, prompt, max_tokens, priority), hold the engine after its
    first step, queue every request of ``then`` while it is held, let it go; the answers by key."""
    async_engine, results = client.app_state.engine, {}

    def send(key, prompt, max_tokens, priority, call=complete):
        return in_thread(results, key, lambda: call(client, prompt, max_tokens, priority=priority))

    recorder.hold(first[1])
    threads = [send(*first, call=stream)]
    assert recorder.paused.wait(120)  # the engine thread is held after a step of `first`
    threads += [send(*request) for request in then]
    wait_for(lambda: async_engine.num_inflight_seqs == 1 + len(then))  # all handed to the held engine thread
    recorder.resume.set()
    for thread in threads:
        thread.join()
    return results


def test_priority_orders_the_queue_and_preempts(client):
    recorder = Recorder(client.app_state.engine.observer)
    client.app_state.engine.observer = recorder
    try:
        # Waiting requests run lowest priority value first once the slot frees.
        results = run_behind(client, recorder, ("first", "hold the slot", LONG, 0),
                             [(p, f"p{p}", 2, p) for p in (3, 1, 2)])
        assert recorder.finished == [results[key]["id"] for key in ("first", 1, 2, 3)]

        # A waiting request of a lower value preempts the running one for its slot.
        recorder.finished.clear()
        results = run_behind(client, recorder, ("low", "low", LONG, 5), [("urgent", "urgent", 2, 0)])
        assert recorder.finished == [results["urgent"]["id"], results["low"]["id"]]
        assert results["low"]["usage"]["completion_tokens"] == LONG  # resumed, not cut short
    finally:
        recorder.resume.set()
        client.app_state.engine.observer = recorder.inner


def test_cache_salt_separates_prefix_hits(client):
    prompt = "a system prompt of a few blocks " * 2  # the byte-level tokenizer: ~2 tokens a word

    def hits_after(**fields) -> float:
        before = engine_counter(client, "octavo:prefix_cache_hits_total")
        complete(client, prompt, 1, **fields)
        return engine_counter(client, "octavo:prefix_cache_hits_total") - before

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
