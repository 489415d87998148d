"""One shared ``octavo serve`` process for the server tests (the tiny Llama
checkpoint, float32), plus clients for it. Modules that need a differently
configured server (faults, shutdown) start their own."""

from __future__ import annotations

import pytest

from tests.entrypoints.server.server_process import ServerProcess

API_KEY = "test-key-123"
MODEL_NAME = "tiny-llama"
MODEL_ALIAS = "tiny-llama-alias"
MAX_MODEL_LEN = 256
MAX_BODY_BYTES = 64 << 10
MAX_HEADER_BYTES = 8 << 10


@pytest.fixture(scope="session")
def server(llama_dir, tmp_path_factory):
    args = [
        "--max-model-len", str(MAX_MODEL_LEN),
        "--max-num-seqs", "256",
        "--api-key", API_KEY,
        "--served-model-name", MODEL_NAME, MODEL_ALIAS,
        "--max-request-body-bytes", str(MAX_BODY_BYTES),
        "--max-request-header-bytes", str(MAX_HEADER_BYTES),
    ]
    process = ServerProcess(llama_dir, args, tmp_path_factory.mktemp("server") / "server.log")
    process.wait_healthy()
    yield process
    process.stop()


@pytest.fixture(scope="session")
def auth_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {API_KEY}"}


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

    llm = LLM(str(llama_dir), dtype="float32", max_model_len=MAX_MODEL_LEN)
    yield llm
    llm.engine.shutdown()
