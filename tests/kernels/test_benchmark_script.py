"""benchmarks/kernels_gpu.py end to end on tiny shapes, so that the script the
GPU runs does not rot: every case kind builds, runs both Triton paths and the
baselines, checks errors and writes its logs. Timing is replaced by one call."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels_gpu.py"


@pytest.fixture
def bench(monkeypatch):
    spec = importlib.util.spec_from_file_location("kernels_gpu_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    shapes = dict(NUM_HEADS=8, NUM_KV_HEADS=2, HEAD_SIZE=32, HIDDEN=64, INTERMEDIATE=96, SCALE=32**-0.5)
    for name, value in shapes.items():
        monkeypatch.setattr(module, name, value)
    monkeypatch.setattr(module, "DEVICE", torch.device("cpu"))
    monkeypatch.setattr(module, "DTYPE", torch.float32)
    monkeypatch.setattr(module, "LAYER_OP_TOKENS", (3,))
    monkeypatch.setattr(module, "time_us", lambda fn, use_graph=True, reps=30: (fn(), 10.0)[1])
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU smoke run; on a GPU run the script itself")
def test_benchmark_script_runs_on_tiny_shapes(bench, tmp_path, monkeypatch):
    cases = [
        bench.AttnCase("decode", [40] * 3, [1] * 3),
        bench.AttnCase("prefill", [24], [24]),
        bench.AttnCase("mixed", [30, 30, 50], [1, 1, 12]),
    ]
    for case in cases:
        bench.run_attention_case(case, copy_bw=1e12)
        bench.say(bench.format_attention(case))
        errors = [v for k, v in case.results.items() if k.endswith("_max_err")]
        assert errors and max(errors) < 1e-4, case.results
    assert cases[0].results["error_against"] == "sdpa" and cases[2].results["error_against"] == "reference"
    assert "split_us" in cases[0].results and "split_us" not in cases[1].results
    bench.sweep(cases[0], bench.DECODE_SWEEP[:1], "split")
    bench.run_layer_ops(copy_bw=1e12)
    monkeypatch.setenv("OUT", str(tmp_path))
    bench.write_logs()
    records = [json.loads(line) for line in (tmp_path / "kernels_gpu.jsonl").read_text().splitlines()]
    assert {r["op"] for r in records if "op" in r} == {
        "rms_norm", "fused_add_rms_norm", "silu_and_mul", "rotary", "reshape_and_cache"
    }
    assert "decode" in (tmp_path / "kernels_gpu.log").read_text()
