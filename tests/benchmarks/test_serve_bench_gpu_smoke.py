"""CPU smoke test of benchmarks/serve_bench_gpu.py on tiny shapes (the demo
model): the offline engine, octavo serve, octavo bench serve at two
concurrencies, the table. Figures are not checked (never timed tests)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from octavo.default_model import default_model_path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_serve_bench_gpu_runs_on_tiny_shapes(tmp_path):
    command = [
        sys.executable, str(ROOT / "benchmarks/serve_bench_gpu.py"), "--out", str(tmp_path), "--label", "smoke",
        "--model", str(default_model_path()), "--dtype", "float32", "--max-model-len", "256",
        "--input-len", "16", "--output-len", "4", "--concurrencies", "1", "4", "--prompts-per-stream", "2",
        "--min-prompts", "4", "--offline-prompts", "8", "--prefill-batch", "4", "--port", str(free_port()),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = (tmp_path / "smoke_table.txt").read_text()
    assert "vs offline" in table and "p99/prefill" in table and "offline engine:" in table
    result = json.loads((tmp_path / "smoke.json").read_text())
    assert [level["max_concurrency"] for level in result["levels"]] == [1, 4]
    assert all(level["failed"] == 0 and level["completed"] >= 4 for level in result["levels"])
    assert result["offline"]["offline_tok_s"] > 0 and result["offline"]["prefill_seconds"] > 0
