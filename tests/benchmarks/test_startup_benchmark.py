"""benchmarks/startup.py runs on the CPU on the tiny checkpoint (a smoke test
of the H200 step ``startup``; nothing about its timings is asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "startup.py"


@pytest.mark.slow
def test_serve_mode_times_health_and_the_logged_phases(llama_dir, tmp_path):
    out = tmp_path / "startup.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "serve", str(llama_dir), "--dtype", "float32", "--max-num-seqs", "4",
         "--no-engine-process", "--log", str(tmp_path / "serve.log"), "--output-json", str(out)],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    result = json.loads(out.read_text())["octavo"]
    names = [name for name, _ in result["phases"]]
    assert {"load weights (safetensors)", "allocate KV cache", "capture graphs"} <= set(names)
    assert result["first_token_s"] >= result["healthy_s"] > 0
    assert "octavo: healthy after start" in done.stdout
