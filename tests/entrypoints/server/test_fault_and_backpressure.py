"""A server of its own, with room for 3 sequences (2 running + 1 queued), no API key, and the
test-only fault hook armed: back-pressure gives a fast 503; then a model step that raises fails
every request in flight (streams: an error chunk, then [DONE]), and /health turns 503."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest

from octavo.entrypoints.fault_injection import FAULT_FILE_ENV
from tests.entrypoints.server.conftest import read_metrics, wait_for
from tests.entrypoints.server.server_process import ServerProcess

# Requests this long are certainly still running when the test acts on them.
MAX_MODEL_LEN = 4096
LONG = {"prompt": "Once upon a time", "max_tokens": MAX_MODEL_LEN - 100, "ignore_eos": True, "temperature": 0}


@pytest.fixture(scope="module")
def fault_file(tmp_path_factory):
    return tmp_path_factory.mktemp("fault") / "raise-now"


CHAT_TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)


@pytest.fixture(scope="module")
def small_server(llama_dir, fault_file, tmp_path_factory):
    template_file = tmp_path_factory.mktemp("template") / "chat.jinja"
    template_file.write_text(CHAT_TEMPLATE)
    args = ["--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "2", "--max-queued-requests", "1",
            "--num-kv-blocks", "1024", "--chat-template", str(template_file), "--no-engine-process"]
    process = ServerProcess(
        llama_dir, args, tmp_path_factory.mktemp("small-server") / "server.log", env={FAULT_FILE_ENV: str(fault_file)}
    )
    process.wait_healthy()
    yield process
    process.stop()


def test_served_model_name_defaults_to_the_model_path(small_server, llama_dir):
    models = httpx.get(f"{small_server.url}/v1/models").json()
    assert [m["id"] for m in models["data"]] == [str(llama_dir)]


def test_chat_template_file_is_used(small_server, reference_llm):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    response = httpx.post(f"{small_server.url}/tokenize", json={"messages": messages})
    assert response.status_code == 200
    rendered = "[system] Be brief.\n[user] Hi there\n[assistant] "
    expected = reference_llm.get_tokenizer().encode(rendered, add_special_tokens=False)
    assert response.json()["tokens"] == expected


def test_a_request_that_can_never_be_admitted_is_a_400(small_server, llama_dir):
    """More sequences than the server ever admits (2 running + 1 queued): 400, not a 503 to retry for ever."""
    model = str(llama_dir)
    for body in ({"prompt": "hi", "n": 4, "max_tokens": 1}, {"prompt": ["a", "b"], "n": 2, "max_tokens": 1}):
        response = httpx.post(f"{small_server.url}/v1/completions", json={**body, "model": model}, timeout=60)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["message"].endswith("the server admits at most 3 at once")
    chat = {"messages": [{"role": "user", "content": "x"}], "n": 4, "max_tokens": 1}
    assert httpx.post(f"{small_server.url}/v1/chat/completions", json=chat, timeout=60).status_code == 400
    fits = httpx.post(f"{small_server.url}/v1/completions", json={"prompt": "hi", "n": 3, "max_tokens": 1}, timeout=60)
    assert fits.status_code == 200, fits.text


async def read_sse(response: httpx.Response) -> list[str]:
    events = []
    async for line in response.aiter_lines():
        if line.startswith("data: "):
            events.append(line[len("data: "):])
    return events


async def read_with_openai(server: ServerProcess, model: str, started: asyncio.Event):
    """Stream a chat through the official client; return the chunks seen and what it raised."""
    import openai

    num_chunks = 0
    async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0) as client:
        try:
            stream = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "x"}], stream=True, max_tokens=MAX_MODEL_LEN - 100,
                extra_body={"ignore_eos": True},
            )
            async for _ in stream:
                num_chunks += 1
                started.set()
        except openai.APIError as exc:
            return num_chunks, exc
        finally:
            started.set()  # never leave the test waiting
    return num_chunks, None


async def fill_and_fault(server: ServerProcess, model: str, fault_file):
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
        stream_ctx = client.stream("POST", "/v1/completions", json={**LONG, "stream": True})
        raw_stream = await stream_ctx.__aenter__()
        assert raw_stream.status_code == 200
        started = asyncio.Event()
        readers = [asyncio.create_task(read_sse(raw_stream)), asyncio.create_task(read_with_openai(server, model, started))]
        await started.wait()
        blocking = asyncio.create_task(client.post("/v1/completions", json=LONG))
        await asyncio.to_thread(wait_for, lambda: read_metrics(server)["octavo:num_inflight_sequences"] == 3)

        # Full: the next requests are refused at once, streaming or not, before any stream starts.
        full = await client.post("/v1/completions", json=LONG)
        full_stream = await client.post("/v1/completions", json={**LONG, "stream": True})
        chat_full = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})

        fault_file.write_text("now")
        events = await asyncio.gather(*readers)
        blocked = await blocking
        await stream_ctx.__aexit__(None, None, None)
        return full, full_stream, chat_full, events, blocked


def test_queue_full_then_engine_fault(small_server, llama_dir, fault_file):
    full, full_stream, chat_full, (raw_events, (num_chunks, client_error)), blocked = asyncio.run(
        fill_and_fault(small_server, str(llama_dir), fault_file)
    )

    queue_full = {
        "error": {
            "message": "the server is at capacity (3 of 3 sequences in flight); retry later",
            "type": "overloaded_error",
            "param": None,
            "code": "queue_full",
        }
    }
    for response in (full, full_stream, chat_full):
        assert response.status_code == 503
        assert response.json() == queue_full

    dead_message = "the engine loop failed: InjectedFault: injected fault at step "
    # The raw stream: chunks, then one error chunk, then [DONE].
    assert raw_events[-1] == "[DONE]"
    error = json.loads(raw_events[-2])["error"]
    assert error["message"].startswith(dead_message) and error["type"] == "engine_error"
    assert error["code"] == "engine_dead"
    assert all("choices" in json.loads(e) for e in raw_events[:-2])
    # The official client raises the error it read from the stream.
    assert num_chunks >= 1
    assert client_error is not None and str(client_error).startswith(dead_message)
    assert blocked.status_code == 503
    assert blocked.json()["error"]["code"] == "engine_dead"

    health = httpx.get(f"{small_server.url}/health")
    assert health.status_code == 503
    assert health.json()["error"]["message"].startswith(dead_message)
    assert read_metrics(small_server)["octavo:engine_alive"] == 0
    assert "the engine loop failed" in small_server.log()  # logged, with its traceback
    assert "Traceback" in small_server.log()
    # Every failure the server caused is counted by reason and logged with its request id;
    # refusals under load are not failures (they are counted as rejections).
    metrics = read_metrics(small_server)
    assert metrics["octavo:request_failures_total{reason=engine_dead}"] >= 3  # two streams in flight, the blocked one
    assert not any(name.startswith("octavo:request_failures_total{reason=queue_full") for name in metrics)
    assert re.search(r"request cmpl-\w+ failed: engine_dead: the engine loop failed", small_server.log())


def test_after_the_fault_requests_fail_fast_with_clients(small_server, llama_dir):
    import anthropic
    import openai

    model = str(llama_dir)
    with openai.OpenAI(base_url=f"{small_server.url}/v1", api_key="none", max_retries=0, timeout=60) as client:
        # Validation still comes first: an unknown model is a 404, not a 503.
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="nope", prompt="hi", max_tokens=2)
        with pytest.raises(openai.InternalServerError) as caught:
            client.completions.create(model=model, prompt="hi", max_tokens=2)
        assert caught.value.status_code == 503
        assert caught.value.body["code"] == "engine_dead"
        with pytest.raises(openai.InternalServerError) as caught:
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], stream=True)
        assert caught.value.status_code == 503
    with anthropic.Anthropic(base_url=small_server.url, api_key="none", max_retries=0, timeout=60) as client:
        with pytest.raises(anthropic.APIStatusError) as caught:
            client.messages.create(model=model, max_tokens=2, messages=[{"role": "user", "content": "x"}])
        assert caught.value.status_code == 503
        assert caught.value.body["error"]["type"] == "overloaded_error"


def test_sigterm_after_the_engine_died_is_fast(small_server):
    """Nothing hangs on a dead engine, so SIGTERM does not wait out the drain timeout (30 s)."""
    import time

    assert httpx.get(f"{small_server.url}/health").status_code == 503
    started = time.monotonic()
    small_server.terminate()
    assert small_server.wait(timeout=60) == 0
    # A deadline, not a benchmark: a hung request would hold the exit for the 30 s drain plus 5.
    assert time.monotonic() - started < 25
