"""``octavo serve --engine-process``: the engine in its own process, the HTTP
server in another. Greedy completions equal the offline engine's, and
/metrics reports the engine's numbers (taken from the engine process)."""

from __future__ import annotations

import httpx

from octavo import SamplingParams
from tests.entrypoints.server.conftest import MAX_MODEL_LEN, NUM_KV_BLOCKS, read_metrics, wait_for
from tests.entrypoints.server.server_process import ServerProcess

MODEL = "tiny-llama-engine-process"


def test_completions_and_metrics_from_the_engine_process(llama_dir, reference_llm, tmp_path):
    args = ["--engine-process", "--max-model-len", str(MAX_MODEL_LEN), "--num-kv-blocks", str(NUM_KV_BLOCKS),
            "--served-model-name", MODEL]
    server = ServerProcess(llama_dir, args, tmp_path / "server.log")
    try:
        server.wait_healthy()
        prompts = ["Once upon a time", "The fox walked to the river"]
        expected = reference_llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8))
        for prompt, reference in zip(prompts, expected):
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0}
            response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
            assert response.status_code == 200, response.text
            assert response.json()["choices"][0]["text"] == reference.outputs[0].text

        def settled():
            metrics = read_metrics(server)
            return metrics if metrics["octavo:num_requests_running"] == 0 else None

        metrics = wait_for(settled)
        assert metrics["octavo:generation_tokens_total"] == sum(len(r.outputs[0].token_ids) for r in expected)
        assert metrics['octavo:request_success_total{finished_reason=length}'] == 2
    finally:
        server.stop()
