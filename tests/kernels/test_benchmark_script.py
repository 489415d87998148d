"""benchmarks/kernels_gpu.py end to end on tiny shapes, so that the script the
GPU runs does not rot: every case kind builds, runs its Triton paths and the
baselines, checks errors and writes its logs; the tile sweep runs its plan on
tiny shapes. Timing is replaced by one call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.scripts import load_script

pytest.importorskip("triton")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels_gpu.py"
SWEEP_SCRIPT = SCRIPT.with_name("kernels_gpu_sweep.py")


@pytest.fixture
def bench(monkeypatch):
    module = load_script(SCRIPT, "kernels_gpu_bench", monkeypatch)
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
    assert "direct_us" in cases[0].results and "direct_us" not in cases[1].results
    bench.run_layer_ops(copy_bw=1e12)
    monkeypatch.setenv("OUT", str(tmp_path))
    bench.write_logs()
    records = [json.loads(line) for line in (tmp_path / "kernels_gpu.jsonl").read_text().splitlines()]
    assert {r["op"] for r in records if "op" in r} == {
        "rms_norm", "fused_add_rms_norm", "silu_and_mul", "rotary", "reshape_and_cache"
    }
    assert "decode" in (tmp_path / "kernels_gpu.log").read_text()


@pytest.fixture
def sweep_module(monkeypatch):
    return load_script(SWEEP_SCRIPT, "kernels_gpu_sweep_bench", monkeypatch)


def test_sweep_lists_cover_the_asked_shapes(sweep_module):
    from octavo.kernels.paged_attention import PREFILL_TILES
    from octavo.kernels.split_kv_decode import DIRECT_DECODE_TILES, SPLIT_TILES

    direct = sweep_module.DIRECT_SWEEP
    assert len(direct) == len(set(direct)) == 27 and {t.block_m for t in direct} == {16}
    assert {(t.block_n, t.num_warps, t.num_stages) for t in direct} == {
        (n, w, s) for n in (32, 64, 128) for w in (2, 4, 8) for s in (2, 3, 4)
    }
    prefill = sweep_module.PREFILL_SWEEP
    assert {t.block_n for t in prefill} == {32, 64, 128} and {t.num_stages for t in prefill} == {2, 3, 4}
    assert {t.block_m for t in prefill} == {64, 128} and {t.num_warps for t in prefill} == {4, 8}
    # The defaults are among the configs, so the parallel compile covers them.
    assert DIRECT_DECODE_TILES in direct and PREFILL_TILES in prefill and SPLIT_TILES in sweep_module.SPLIT_SWEEP


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU smoke run; on a GPU run the script itself")
def test_sweep_runs_its_plan_on_tiny_shapes(bench, sweep_module, monkeypatch):
    tiny = dict(DIRECT_SHAPES=((3, 40),), PREFILL_TOKENS=(24,), SPLIT_SHAPES=((2, 70),))
    for name, value in tiny.items():
        monkeypatch.setattr(sweep_module, name, value)
    monkeypatch.setattr(sweep_module, "DIRECT_SWEEP", [bench.TileConfig(16, 32, 2, 2), bench.TileConfig(16, 16, 2, 2)])
    monkeypatch.setattr(sweep_module, "PREFILL_SWEEP", [bench.TileConfig(32, 16, 4, 2)])
    monkeypatch.setattr(sweep_module, "SPLIT_SWEEP", [bench.TileConfig(16, 16, 2, 2)])
    monkeypatch.setattr(sweep_module, "precompile", lambda bench, plan: None)  # worker processes need CUDA
    plan = sweep_module.sweep_plan(bench)
    assert [(case.name, key) for case, _, key in plan] == [
        ("decode b=3 ctx=40", "direct"), ("prefill 24", "one_launch"), ("decode b=2 ctx=70", "split")
    ]
    sweep_module.run_sweep(bench, copy_bw=1e12)
    records = [r for r in bench.RECORDS if "sweep" in r]
    assert [(r["sweep"], r["case"]) for r in records] == [
        ("direct", "decode b=3 ctx=40"), ("direct", "decode b=3 ctx=40"),
        ("one_launch", "prefill 24"), ("split", "decode b=2 ctx=70"),
    ]
    assert all(r["error_vs_default"] < 1e-4 for r in records)
    log = "\n".join(bench.LOG_LINES)
    assert "best 1" in log and "% of copy" in log and "TFLOP/s" in log
    sweep_module.run_sweep(bench, copy_bw=1e12, budget_s=-1)
    assert bench.LOG_LINES[-2].endswith("skipped: the sweep's -1 s are spent")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU smoke run; on a GPU run the script itself")
def test_long_context_sweep_writes_its_winners(bench, sweep_module, monkeypatch, tmp_path):
    monkeypatch.setattr(sweep_module, "LONG_PREFILL", ((40, 24),))
    monkeypatch.setattr(sweep_module, "LONG_SPLIT", ((1, 70),))
    monkeypatch.setattr(sweep_module, "LONG_EXTRA_SPLITS", (8,))
    # The second config of each list is the default itself: the first can only win by being faster.
    monkeypatch.setattr(sweep_module, "PREFILL_SWEEP", [bench.TileConfig(32, 16, 4, 2), bench.tiles_for(24, bench.HEAD_SIZE)])
    monkeypatch.setattr(sweep_module, "SPLIT_SWEEP", [bench.TileConfig(16, 16, 2, 2)])
    monkeypatch.setattr(sweep_module, "precompile", lambda bench, plan: None)
    plan = sweep_module.sweep_plan(bench, long_context=True)
    assert [(case.name, key) for case, _, key in plan] == [
        ("prefill 24 @ 40", "one_launch"), ("prefill 24 @ 40", "fresh"), ("decode b=1 ctx=70", "split"),
        ("decode b=1 ctx=70", "split8")]
    env_file = tmp_path / "long.env"
    sweep_module.run_sweep(bench, copy_bw=1e12, long_context=True, env_file=str(env_file))
    records = [r for r in bench.RECORDS if "sweep" in r]
    assert [(r["sweep"], r["case"]) for r in records][-6:] == [
        ("one_launch", "prefill 24 @ 40"), ("one_launch", "prefill 24 @ 40"), ("fresh", "prefill 24 @ 40"),
        ("fresh", "prefill 24 @ 40"), ("split", "decode b=1 ctx=70"), ("split8", "decode b=1 ctx=70")]
    for line in env_file.read_text().splitlines():  # only winners, in the OCTAVO_TILES_* form the runtime reads
        name, value = line.split("=")
        assert name in ("OCTAVO_TILES_PREFILL", "OCTAVO_TILES_SPLIT") and len(value.split(",")) == 4


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU smoke run; on a GPU run the script itself")
@pytest.mark.parametrize("fused, gated", [("gate_up_silu", "silu"), ("gate_up_gelu", "gelu_tanh")])
def test_gemv_sweep_runs_on_tiny_shapes(fused, gated, monkeypatch):
    from octavo.kernels.gemv import GemvConfig

    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # the script imports its neighbours
    module = load_script(SCRIPT.with_name("gemv_gpu_sweep.py"), "gemv_gpu_sweep_bench", monkeypatch)
    shapes = {"qkv": (48, 32, None), "o": (32, 32, None), "gate_up": (64, 32, None),
              fused: (64, 32, gated), "down": (32, 48, None), "lm_head": (80, 32, None)}
    tiny = dict(WIDTHS=(32, 48), SHAPES=shapes, FUSED=fused, CHAIN_LAYERS=2, DEVICE=torch.device("cpu"),
                DTYPE=torch.float32, time_us=lambda fn, use_graph=True, reps=30: (fn(), 10.0)[1])
    for name, value in tiny.items():
        monkeypatch.setattr(module, name, value)
    configs = [GemvConfig(4, 16, 2, 2, True), GemvConfig(2, 32, 2, 2, False)]
    weights = module.make_weights(torch.Generator().manual_seed(0))
    best_plain, best_silu = module.run_sweep(1, weights, configs)
    assert best_plain in configs and best_silu in configs
    records = [r for r in module.RECORDS if r.get("tokens") == 1]
    assert len(records) == 3 and all("failed" not in r for r in records)  # cuBLAS and both configs, all correct
    module.run_chain(1, {"cublas": (None, None, False), "fused": (configs[0], configs[1], True),
                         "unfused": (configs[0], None, False)}, copy_bw=1e12)
    assert [r["variant"] for r in module.RECORDS if "chain_tokens" in r] == ["cublas", "fused", "unfused"]


def test_gemv_sweep_takes_a_models_shapes(monkeypatch):
    # --model: Gemma-2-9B's linear layers; its GeGLU gate-up is fused as the runtime fuses it.
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    module = load_script(SCRIPT.with_name("gemv_gpu_sweep.py"), "gemv_gpu_sweep_bench", monkeypatch)
    for name in ("SHAPES", "PLAIN_WEIGHT", "WIDTHS", "FUSED"):
        monkeypatch.setattr(module, name, getattr(module, name))  # restored after the test
    assert module.use_model(str(SCRIPT.parent / "configs" / "gemma-2-9b")) == "gemma-2-9b"
    assert module.SHAPES["qkv"] == (8192, 3584, None) and module.SHAPES["o"] == (3584, 4096, None)
    assert module.SHAPES["lm_head"] == (256000, 3584, None) and module.WIDTHS == (3584, 4096, 14336)
    assert module.FUSED == "gate_up_gelu" and module.SHAPES["gate_up_gelu"] == (28672, 3584, "gelu_tanh")
    assert "gate_up" not in module.PLAIN_WEIGHT and module.PLAIN_WEIGHT["lm_head"] == 1 / 42


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU smoke run; on a GPU run the script itself")
def test_kv_decode_sweep_runs_on_tiny_shapes(bench, monkeypatch, tmp_path):
    """benchmarks/kv_decode_sweep.py: both cache dtypes at one context, default
    tiles, the sweep, the split counts, the fp8/bf16 ratio and the env file."""
    module = load_script(SCRIPT.with_name("kv_decode_sweep.py"), "kv_decode_sweep_bench", monkeypatch)
    monkeypatch.setattr(bench, "copy_bandwidth", lambda: 1e12)
    sweeps = {"bf16": [bench.TileConfig(16, 16, 2, 2)], "fp8": [bench.TileConfig(16, 32, 2, 2)]}
    monkeypatch.setattr(module, "SWEEPS", sweeps)
    monkeypatch.setattr(module, "PREFILL_SWEEP", [bench.TileConfig(32, 16, 4, 2)])
    env_file = tmp_path / "tiles.env"
    records = module.run(bench, [300], str(env_file), chunks=[(20, 50)])
    timed = [r for r in records if "error_vs_default" in r]
    assert {(r["case"], r["kv"]) for r in timed} == {
        (case, kv) for case in ("decode 300", "chunk 20@50") for kv in ("bf16", "fp8")
    }
    assert all(r["error_vs_default"] < 1e-4 for r in timed)
    assert [r["splits"] for r in records if r.get("kv") == "fp8" and "error_vs_default" not in r] == [2, 8]
    assert [r["case"] for r in records if "fp8_over_bf16" in r] == ["decode 300", "chunk 20@50"]
    names = [line.split("=")[0] for line in env_file.read_text().splitlines()]
    assert names == ["OCTAVO_TILES_SPLIT", "OCTAVO_TILES_SPLIT_FP8", "OCTAVO_TILES_PREFILL", "OCTAVO_TILES_PREFILL_FP8"]
