"""benchmarks/long_context.py end to end on a tiny model on the CPU, so that
the script the GPU round runs (step ``longctx``) does not rot."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "long_context.py"


def test_long_context_script_runs_on_tiny_shapes(llama_dir, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("long_context_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "long.json"
    argv = ["--model", str(llama_dir), "--dtype", "float32", "--platform", "cpu", "--ttft-lens", "40,80",
            "--decode-lens", "40", "--decode-steps", "3", "--iters", "1", "--max-num-batched-tokens", "32",
            "--async-scheduling", "--output-json", str(out)]
    assert module.main(argv) == 0
    printed = capsys.readouterr().out
    assert "KV cache:" in printed and "async scheduling: True" in printed
    assert "| TTFT, one 80-token prompt |" in printed and "| batch-1 decode at 40 context |" in printed
    results = json.loads(out.read_text())
    assert set(results["ttft"]) == {"40", "80"} and set(results["decode"]) == {"40"}
    for row in [*results["ttft"].values(), *results["decode"].values()]:
        assert row["floor_s"] > 0 and row["attention_floor_s"] > 0 and row["sdpa_attention_s"] > 0
