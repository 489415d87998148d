"""One shared ``octavo serve`` process for the server tests (the tiny Llama
checkpoint, float32), plus clients for it. Modules that need a differently
configured server (faults, shutdown) start their own."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.entrypoints.server.server_process import ServerProcess

API_KEY = "test-key-123"
MODEL_NAME = "tiny-llama"
MODEL_ALIAS = "tiny-llama-alias"
MAX_MODEL_LEN = 2048
# Long enough that a request asked for (nearly) all of it is still running when a test acts on it.
NUM_KV_BLOCKS = 4096
MAX_BODY_BYTES = 64 << 10
MAX_HEADER_BYTES = 8 << 10


@pytest.fixture(scope="session")
def server(llama_dir, tmp_path_factory):
    args = [
        "--max-model-len", str(MAX_MODEL_LEN),
        "--max-num-seqs", "256",
        "--num-kv-blocks", str(NUM_KV_BLOCKS),
        "--api-key", API_KEY,
        "--served-model-name", MODEL_NAME, MODEL_ALIAS,
        "--max-request-body-bytes", str(MAX_BODY_BYTES),
        "--max-request-header-bytes", str(MAX_HEADER_BYTES),
    ]
    with ServerProcess.running(llama_dir, args, tmp_path_factory.mktemp("server") / "server.log") as process:
        yield process


@pytest.fixture(scope="session")
def auth_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {API_KEY}"}


# The demo model (it writes real text and stops on EOS), served twice for the
# hardening and fuzz suites: with the engine in its own process (the default)
# and in the server's process. Both restart a failed engine; the in-process one
# has the test fault hook, short connection timeouts and a prompt-character
# limit high enough to tokenise a 10 MB prompt.
DEMO_MODEL = "octavo-demo"
DEMO_MAX_MODEL_LEN = 512
DEMO_HEADER_TIMEOUT_S = 2.0
DEMO_BODY_TIMEOUT_S = 2.0
DEMO_MAX_CONNECTIONS = 1500


def _start_demo(tmp_path_factory, name: str, extra: list[str], env: dict[str, str] | None = None) -> ServerProcess:
    args = ["--max-model-len", str(DEMO_MAX_MODEL_LEN), "--api-key", API_KEY, "--restart-engine", *extra]
    process = ServerProcess(None, args, tmp_path_factory.mktemp(name) / "server.log", env=env)
    process.wait_healthy()
    warm_up(process)
    return process


def warm_up(server: ServerProcess) -> None:
    """One generation, so that first-request costs (imports, first forward) are paid before a test times anything."""
    body = {"prompt": "Once upon a time", "max_tokens": 2}
    response = httpx.post(f"{server.url}/v1/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120)
    assert response.status_code == 200, response.text


@pytest.fixture(scope="session")
def demo_server(tmp_path_factory):
    process = _start_demo(tmp_path_factory, "demo-server", [])
    yield process
    process.stop()


@pytest.fixture(scope="session")
def demo_fault_file(tmp_path_factory):
    return tmp_path_factory.mktemp("demo-fault") / "raise-now"


@pytest.fixture(scope="session")
def demo_server_inproc(tmp_path_factory, demo_fault_file):
    from octavo.entrypoints.fault_injection import FAULT_FILE_ENV

    extra = [
        "--no-engine-process",
        "--header-read-timeout", str(DEMO_HEADER_TIMEOUT_S),
        "--body-read-timeout", str(DEMO_BODY_TIMEOUT_S),
        "--max-connections", str(DEMO_MAX_CONNECTIONS),
        "--max-prompt-chars", str(20_000_000),
    ]
    process = _start_demo(tmp_path_factory, "demo-server-inproc", extra, env={FAULT_FILE_ENV: str(demo_fault_file)})
    yield process
    process.stop()


@pytest.fixture(scope="session", params=["engine-process", "in-process"])
def any_demo_server(request):
    """Each demo server in turn: the engine in its own process, then in the server's."""
    return request.getfixturevalue("demo_server" if request.param == "engine-process" else "demo_server_inproc")


@pytest.fixture
def openai_client(server):
    import openai

    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120) as client:
        yield client


@pytest.fixture
def anthropic_client(server):
    import anthropic

    with anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0, timeout=120) as client:
        yield client


def async_openai(server):
    import openai

    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def async_anthropic(server):
    import anthropic

    return anthropic.AsyncAnthropic(base_url=server.url, api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def reference_llm(llama_dir):
    """The offline engine on the same checkpoint, for greedy parity."""
    from octavo import LLM

    llm = LLM(str(llama_dir), dtype="float32", max_model_len=MAX_MODEL_LEN, num_kv_blocks=NUM_KV_BLOCKS)
    yield llm
    llm.engine.shutdown()


def read_metrics(server, headers: dict[str, str] | None = None) -> dict[str, float]:
    """``/metrics`` as ``{"name{label=value}": value}`` (label-less samples by bare name)."""
    import httpx

    return parse_metrics(httpx.get(f"{server.url}/metrics", headers=headers or {}, timeout=60).text)


def parse_metrics(text: str) -> dict[str, float]:
    """A /metrics text as ``{"name{label=value}": value}`` (label-less samples by bare name)."""
    from prometheus_client.parser import text_string_to_metric_families

    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def wait_for(predicate, timeout: float = 120.0, interval: float = 0.05):
    """Poll until ``predicate()`` is truthy (not a timing assertion: the deadline only avoids hanging)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def run_while_polling_health(url: str, run_jobs) -> tuple[list, list[int]]:
    """Await ``run_jobs()`` while polling ``/health`` every 50 ms; return its
    result and every status seen."""

    async def main():
        done = asyncio.Event()
        health_codes: list[int] = []

        async def watch_health():
            async with httpx.AsyncClient(base_url=url, timeout=60) as http:
                while not done.is_set():
                    health_codes.append((await http.get("/health")).status_code)
                    await asyncio.sleep(0.05)

        watcher = asyncio.create_task(watch_health())
        try:
            results = await run_jobs()
        finally:
            done.set()
            await watcher
        return results, health_codes

    return asyncio.run(main())


# The tool-calling chat model (Llama 2 tokenizer, Qwen-style template), served
# with the hermes tool parser, the qwen3 reasoning parser, a tight KV cache
# (preemption under load) and low structured-output limits (so that the tests
# can exceed them cheaply).
CHAT_MODEL_NAME = "chat-model"
GRAMMAR_TIMEOUT_S = 1.0
MAX_GRAMMAR_BYTES = 300_000


@pytest.fixture(scope="session")
def chat_server(chat_model_dir, tmp_path_factory):
    args = [
        "--served-model-name", CHAT_MODEL_NAME,
        "--max-model-len", "1024", "--block-size", "8", "--num-kv-blocks", "96", "--max-num-seqs", "16",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3",
        "--structured-outputs-compile-timeout", str(GRAMMAR_TIMEOUT_S),
        "--structured-outputs-max-grammar-bytes", str(MAX_GRAMMAR_BYTES),
    ]
    with ServerProcess.running(chat_model_dir, args, tmp_path_factory.mktemp("chat-server") / "server.log") as process:
        yield process


@pytest.fixture
def chat_openai(chat_server):
    import openai

    with openai.OpenAI(base_url=f"{chat_server.url}/v1", api_key="unused", max_retries=0, timeout=120) as client:
        yield client


@pytest.fixture
def chat_anthropic(chat_server):
    import anthropic

    with anthropic.Anthropic(base_url=chat_server.url, api_key="unused", max_retries=0, timeout=120) as client:
        yield client
