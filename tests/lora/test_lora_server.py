"""LoRA adapters served by ``octavo serve --enable-lora --lora-modules`` (the
engine in its own process), driven by the openai SDK: each adapter is a model
of its own in /v1/models and in requests, with PEFT's greedy tokens;
adapters loaded and unloaded at run time (vLLM's routes); a bad adapter
stops the start-up with its reason."""

from __future__ import annotations

import json

import pytest

from tests.entrypoints.server.server_process import ServerProcess
from tests.lora.conftest import NUM_NEW_TOKENS, PROMPTS

API_KEY = "lora-test-key"


@pytest.fixture(scope="module")
def lora_server(llama_dir, adapters, tmp_path_factory):
    args = [
        "--max-model-len", "256", "--num-kv-blocks", "64", "--api-key", API_KEY, "--served-model-name", "base",
        "--enable-lora", "--max-loras", "2", "--max-lora-rank", "8", "--allow-runtime-lora-updating",
        "--lora-modules", f"every={adapters['every']}", json.dumps({"name": "qv", "path": str(adapters["qv"])}),
    ]
    with ServerProcess.running(llama_dir, args, tmp_path_factory.mktemp("lora-server") / "server.log") as process:
        yield process


def test_adapters_are_models(lora_server, adapters, references):
    import httpx
    import openai

    client = openai.OpenAI(base_url=f"{lora_server.url}/v1", api_key=API_KEY)
    cards = {card.id: card for card in client.models.list().data}
    assert list(cards) == ["base", "every", "qv"]
    assert cards["every"].root == str(adapters["every"]) and cards["every"].parent == "base"
    for model, name in (("base", None), ("every", "every"), ("qv", "qv")):
        for prompt, expected in zip(PROMPTS, references[name]):
            completion = client.completions.create(
                model=model, prompt=prompt, max_tokens=NUM_NEW_TOKENS, temperature=0.0,
                extra_body={"min_tokens": NUM_NEW_TOKENS, "return_token_ids": True},
            )
            assert completion.choices[0].token_ids == expected, model
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="missing-adapter", prompt=PROMPTS[0], max_tokens=2)
    metrics = httpx.get(f"{lora_server.url}/metrics", headers={"Authorization": f"Bearer {API_KEY}"}).text
    assert 'octavo:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""}' in metrics


def completion_tokens(client, model: str, prompt: list[int]) -> list[int]:
    completion = client.completions.create(
        model=model, prompt=prompt, max_tokens=NUM_NEW_TOKENS, temperature=0.0,
        extra_body={"min_tokens": NUM_NEW_TOKENS, "return_token_ids": True},
    )
    return completion.choices[0].token_ids


def test_load_and_unload_at_run_time(lora_server, adapters, references, tmp_path):
    import httpx
    import openai

    client = openai.OpenAI(base_url=f"{lora_server.url}/v1", api_key=API_KEY)
    headers = {"Authorization": f"Bearer {API_KEY}"}

    def post(route: str, body: dict) -> httpx.Response:
        return httpx.post(f"{lora_server.url}/v1/{route}", json=body, headers=headers, timeout=30.0)

    assert post("load_lora_adapter", {"lora_name": "qv2", "lora_path": str(adapters["qv"])}).status_code == 200
    assert "qv2" in [card.id for card in client.models.list().data]
    assert completion_tokens(client, "qv2", PROMPTS[0]) == references["qv"][0]
    taken = post("load_lora_adapter", {"lora_name": "qv2", "lora_path": str(adapters["every"])})
    assert taken.status_code == 400 and "already served" in taken.json()["error"]["message"]
    missing = post("load_lora_adapter", {"lora_name": "gone", "lora_path": str(tmp_path / "nothing")})
    assert missing.status_code == 400 and "is not a directory" in missing.json()["error"]["message"]
    assert post("unload_lora_adapter", {"lora_name": "qv2"}).status_code == 200
    with pytest.raises(openai.NotFoundError):
        completion_tokens(client, "qv2", PROMPTS[0])
    assert post("unload_lora_adapter", {"lora_name": "qv2"}).status_code == 404
    # Loaded again from another directory: a new adapter id, the other adapter's tokens.
    assert post("load_lora_adapter", {"lora_name": "qv2", "lora_path": str(adapters["every"])}).status_code == 200
    assert completion_tokens(client, "qv2", PROMPTS[1]) == references["every"][1]
    assert httpx.post(f"{lora_server.url}/v1/unload_lora_adapter", json={"lora_name": "qv2"}).status_code == 401


def test_bad_adapter_stops_the_start(llama_dir, adapters, tmp_path):
    args = ["--max-model-len", "256", "--num-kv-blocks", "64", "--enable-lora", "--max-lora-rank", "4",
            "--lora-modules", f"every={adapters['every']}"]
    process = ServerProcess(llama_dir, args, tmp_path / "server.log")
    try:
        with pytest.raises(RuntimeError, match="above max_lora_rank=4"):
            process.wait_healthy()
    finally:
        process.stop()
