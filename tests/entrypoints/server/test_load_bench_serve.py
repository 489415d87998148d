"""The issue-19 load on the CPU: ``octavo bench serve`` (the same client as
against any OpenAI server) sends 1,000 streamed requests at concurrency 200
to ``octavo serve`` on the demo model (engine in its own process). None may
fail, the server may count no failure, and every KV block is free after."""

from __future__ import annotations

import json

import pytest

from octavo.default_model import default_model_path
from octavo.entrypoints.cli.main import main
from tests.entrypoints.server.conftest import API_KEY, read_metrics, wait_for

NUM_PROMPTS = 1000
CONCURRENCY = 200
OUTPUT_LEN = 2


@pytest.mark.slow
def test_1000_streamed_requests_at_concurrency_200(demo_server, tmp_path):
    # The server is shared with other modules (some fail its engine on purpose): compare with before.
    headers = {"Authorization": f"Bearer {API_KEY}"}
    failures_before, log_before = server_failures(read_metrics(demo_server, headers)), len(demo_server.log())
    out = tmp_path / "bench.json"
    argv = [
        "bench", "serve", "--base-url", demo_server.url, "--api-key", API_KEY, "--tokenizer", str(default_model_path()),
        "--dataset-name", "random", "--random-input-len", "8", "--random-output-len", str(OUTPUT_LEN),
        "--num-prompts", str(NUM_PROMPTS), "--max-concurrency", str(CONCURRENCY), "--ignore-eos", "--disable-tqdm",
        "--output-json", str(out),
    ]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert (result["completed"], result["failed"], result["errors"]) == (NUM_PROMPTS, 0, [])
    assert result["total_output_tokens"] == NUM_PROMPTS * OUTPUT_LEN

    wait_for(lambda: read_metrics(demo_server, headers)["octavo:num_inflight_sequences"] == 0)
    metrics = read_metrics(demo_server, headers)
    assert metrics["octavo:kv_cache_free_blocks"] == metrics["octavo:kv_cache_total_blocks"]
    assert server_failures(metrics) == failures_before
    assert "failed:" not in demo_server.log()[log_before:]


def server_failures(metrics: dict[str, float]) -> float:
    return sum(value for name, value in metrics.items() if name.startswith("octavo:request_failures_total"))
