"""benchmarks/quant_gpu.py and quant_sweep_gpu.py end to end on tiny shapes
on the CPU (Triton's interpreter, in a subprocess), so that the scripts the
GPU round runs do not rot: every path builds and is checked against its
reference, the timing tables print, the sweep runs its plan. Timing is one
call; paths that need a GPU (torch's int4 and block-wise fp8 built-ins)
report themselves unavailable."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from tests.quantization.interpreter import needs_interpreter, not_interpreted, rerun_under_interpreter  # noqa: E402

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@not_interpreted
@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU smoke run; on a GPU run the scripts themselves")
def test_scripts_under_interpreter():
    rerun_under_interpreter(__file__)


@pytest.fixture
def scripts(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    for name in ("quant_paths", "quant_gpu", "quant_sweep_gpu", "kernels_gpu", "kernels_gpu_sweep"):
        sys.modules.pop(name, None)
    import quant_gpu
    import quant_paths
    import quant_sweep_gpu

    monkeypatch.setattr(quant_paths, "DEVICE", torch.device("cpu"))
    monkeypatch.setattr(quant_paths, "DTYPE", torch.float32)
    monkeypatch.setattr(quant_paths, "SHAPES", [("qkv", 256, 48), ("down", 512, 32)])
    # fp8_block and the other GGUF types: the same script code, kernels tested in their own files.
    monkeypatch.setattr(quant_paths, "FAMILIES", ("bf16", "fp8", "int4", "gguf_Q4_K"))
    for module in (quant_gpu, quant_sweep_gpu):
        monkeypatch.setattr(module, "time_us", lambda fn, use_graph=True, reps=30: (fn(), 10.0)[1])
        monkeypatch.setattr(module, "copy_bandwidth", lambda: 1e12)
    monkeypatch.setattr(quant_gpu, "CHECK_TOKENS", (3,))
    for name, value in dict(KV_HEADS=2, KV_GROUP=2, KV_HEAD_SIZE=32, KV_SEQ_LENS=(20, 37), KV_BLOCKS=8).items():
        monkeypatch.setattr(quant_gpu, name, value)
    return quant_gpu, quant_sweep_gpu


@needs_interpreter
def test_quant_gpu_script(scripts, capsys):
    quant_gpu, _ = scripts
    quant_gpu.correctness()
    failed = [c for c in quant_gpu.RESULTS["checks"] if not c["ok"]]
    assert quant_gpu.RESULTS["checks"] and not failed, failed
    quant_gpu.timings((1,), bandwidth=1e12)
    quant_gpu.print_tables((1,))
    out = capsys.readouterr().out
    assert "int4:" in out and "tc_mm" in out and "gguf_Q4_K:" in out and "floor" in out and "vs bf16" in out


@needs_interpreter
def test_quant_gpu_reports_a_path_that_fails_while_timed(scripts, monkeypatch, capsys):
    """A path whose timing raises (a graph capture it cannot take) prints FAILED; the others are timed."""
    quant_gpu, _ = scripts
    failing = quant_gpu.qp.path_by_label("int4", "tc_mm")
    real_time_layer = quant_gpu.time_layer

    def time_layer(path, weights, num_tokens):
        timer = _raise if path.label == failing.label else (lambda fn, use_graph=True, reps=30: (fn(), 10.0)[1])
        monkeypatch.setattr(quant_gpu, "time_us", timer)
        return real_time_layer(path, weights, num_tokens)

    monkeypatch.setattr(quant_gpu, "time_layer", time_layer)
    monkeypatch.setattr(quant_gpu.qp, "FAMILIES", ("int4",))
    quant_gpu.timings((16,), bandwidth=1e12)
    out = capsys.readouterr().out
    assert "int4 tc_mm M=16 qkv: FAILED <RuntimeError: operation not permitted when stream is capturing>" in out
    timed = {(r["family"], r["path"]) for r in quant_gpu.RESULTS["timings"]}
    assert ("int4", "dequant+cublas") in timed and ("int4", "tc_mm") not in timed


def _raise(fn, use_graph=True, reps=30):
    raise RuntimeError("operation not permitted when stream is capturing")


@needs_interpreter
def test_quant_sweep_script(scripts, capsys):
    _, sweep = scripts
    # Two of the plan's cases, one config each: the sweep's code is the same for all.
    picked = [next(case for case in sweep.PLAN if case[:2] == key) for key in (("int4", "tc_mm"), ("gguf_Q4_K", "gemv"))]
    plan = [(family, path, tokens[:1], configs[:1]) for family, path, tokens, configs in picked]
    best = sweep.run(plan=plan, budget_s=1e9)
    assert all(config is not None for config in best.values()), best
    assert "best configs" in capsys.readouterr().out


def test_quant_sweep_leaves_out_a_config_that_computes_something_else(scripts, capsys):
    # Each config's outputs against the default's: a miscompiled tile must not be exported.
    _, sweep = scripts
    reference: dict = {}
    out = torch.randn(1, 64)
    assert sweep._agrees(reference, "qkv", out, "default") and torch.equal(reference["qkv"], out)
    assert sweep._agrees(reference, "qkv", out * (1 + 1e-3), "close")
    assert not sweep._agrees(reference, "qkv", out.roll(1, dims=1), "shuffled")
    assert "wrong result" in capsys.readouterr().out


@needs_interpreter
def test_quant_sweep_exports_the_one_token_winners(scripts, tmp_path, capsys):
    # `--only int4:gemv,fp8:gemv --tokens 1 --env-file F`: the tuned end-to-end run reads F.
    _, sweep = scripts
    plan = sweep.select_plan("int4:gemv,fp8:gemv", "1")
    assert [(family, path, tokens) for family, path, tokens, _ in plan] == [("fp8", "gemv", (1,)), ("int4", "gemv", (1,))]
    deferred = next(c for c in plan[1][3] if c.deferred and c.blocks == 16 and c.row_groups == 2)
    plan = [(plan[0][0], plan[0][1], (1,), plan[0][3][:1]), (plan[1][0], plan[1][1], (1,), [deferred])]
    best = sweep.run(plan=plan, budget_s=1e9)
    env_file = tmp_path / "tuned.env"
    sweep.write_env_file(best, str(env_file))
    fp8 = plan[0][3][0]
    assert env_file.read_text().splitlines() == [
        f"OCTAVO_GEMV_8BIT={fp8.block_n},{fp8.block_k},{fp8.num_warps},{fp8.num_stages},{int(fp8.defer_reduce)},"
        f"{int(fp8.prefetch)},{int(fp8.pipelined)}",
        f"OCTAVO_INT4_GEMV_TILES={deferred.block_n},16,{deferred.num_warps},1,2,0",
    ]


@needs_interpreter
def test_gemv_shapes_script(scripts, monkeypatch, capsys):
    # benchmarks/gemv_shapes_gpu.py: a row per path and shape, each shape's bytes, then the layer's.
    sys.modules.pop("gemv_shapes_gpu", None)
    import gemv_shapes_gpu

    monkeypatch.setattr(gemv_shapes_gpu, "time_us", lambda fn, use_graph=True, reps=30: (fn(), 10.0)[1])
    monkeypatch.setattr(gemv_shapes_gpu, "copy_bandwidth", lambda: 1e12)
    gemv_shapes_gpu.RESULTS.clear()
    gemv_shapes_gpu.main("bf16:gemv,int4:gemv_rows,int4:gemv_dp4a,gguf_Q4_K:gemv_dp4a,probe:read_4_2_1", copies=2)
    rows = {(r["path"], r["shape"]): r for r in gemv_shapes_gpu.RESULTS}
    paths = ("bf16 gemv", "int4 gemv_rows", "int4 gemv_dp4a", "gguf_Q4_K gemv_dp4a", "int4 read_4_2_1")
    assert set(rows) == {(p, s) for p in paths for s in ("qkv", "down", "layer")}
    # float32 weights here: 48 x 256 x 4 bytes and the activation's 256 x 4.
    assert rows[("bf16 gemv", "qkv")]["bytes"] == 48 * 256 * 4 + 256 * 4
    assert rows[("int4 gemv_rows", "layer")]["bytes"] < rows[("bf16 gemv", "layer")]["bytes"] / 4
    assert "an empty launch in a graph 5.00 us" in capsys.readouterr().out
    # --sweep-int4: the plain tiles only (two here), the best first for each shape.
    import quant_sweep_gpu

    tiles = [quant_sweep_gpu.RowsTiles(8, 2, 2), quant_sweep_gpu.RowsTiles(4, 4, 4), quant_sweep_gpu.RowsTiles(8, 2, 2, 1, 1)]
    monkeypatch.setattr(quant_sweep_gpu, "INT4_ROWS", tiles)
    gemv_shapes_gpu.RESULTS.clear()
    gemv_shapes_gpu.main("", copies=2, sweep_int4=True)
    assert [(r["shape"], r["tiles"][:3]) for r in gemv_shapes_gpu.RESULTS] == [
        (shape, t) for shape in ("qkv", "down") for t in ([8, 2, 2], [4, 4, 4])]
    assert "int4 rows down: " in capsys.readouterr().out


@not_interpreted
def test_make_gguf_8b_writes_a_loadable_file(tmp_path):
    """The GPU round's GGUF writer, at tiny shapes: the file loads and runs a prefill."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import make_gguf_8b
    finally:
        sys.path.remove(str(BENCHMARKS))
    from tests.quantization import helpers

    config = dict(hidden_size=256, intermediate_size=512, vocab_size=512, num_attention_heads=4, num_key_value_heads=2,
                  num_hidden_layers=2, rms_norm_eps=1e-5, rope_theta=500000.0)
    path = make_gguf_8b.write(tmp_path / "tiny.gguf", "Q4_K", "Q6_K", config)
    loaded = helpers.load(path)
    assert loaded.arch.hidden_size == 256
    logits = helpers.prefill_logits(loaded, [1, 2, 3, 4])
    assert logits.shape == (4, 512) and bool(torch.isfinite(logits).all())


@not_interpreted
def test_quant_e2e_tables(quant_llama_dir, capsys, monkeypatch, tmp_path):
    """benchmarks/quant_e2e.py on a tiny checkpoint on the CPU: each method's row
    beside the baseline's, with its own floor; the kv mode's capacity column,
    from the budget (one fixed CPU budget here, as gpu_memory_utilization
    gives on a GPU): a float32 model's fp8 cache holds 4x the sequences."""
    monkeypatch.setenv("OCTAVO_CPU_KVCACHE_SPACE", "0.25")
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import quant_e2e
    finally:
        sys.path.remove(str(BENCHMARKS))
    common = ["--model", str(quant_llama_dir), "--load-format", "safetensors", "--dtype", "float32",
              "--num-iters", "1", "--gpu-memory-utilization", "0.5"]
    assert quant_e2e.main(["latency", "--methods", "bf16,int4", "--input-len", "8", "--output-len", "3", *common]) == 0
    kv_json = tmp_path / "kv.json"
    assert quant_e2e.main(["kv", "--context", "40", "--output-len", "3", "--output-json", str(kv_json), *common]) == 0
    out = capsys.readouterr().out
    assert "floor ms/tok" in out and "\nint4 " in out and "fp8 KV" in out and "4k seqs" in out
    auto_kv, fp8_kv = json.loads(kv_json.read_text())["rows"]
    assert auto_kv["seqs_4k"] > 0 and fp8_kv["seqs_4k"] == 4 * auto_kv["seqs_4k"]


def test_fbgemm_int4_convention_reproduces_octavo_weights():
    # The one conversion the fbgemm int4 path makes by hand (its kernels need a GPU).
    from octavo.kernels.quant import int4
    from octavo.kernels.quant.fbgemm_int4 import fbgemm_values

    dense = torch.randn(48, 256, generator=torch.Generator().manual_seed(0)) * 0.02
    weights = int4.quantize_int4_rtn(dense.to(torch.bfloat16), 128)
    centred, scale, zero = fbgemm_values(*weights)
    groups = torch.arange(256) // 128
    rebuilt = centred.float() * scale.float().t()[:, groups] + zero.float().t()[:, groups]
    expected = int4.dequantize_int4(*weights, 128, torch.float32)
    # Exact but for the bf16 zero: (8 - zero point) * scale rounded once.
    assert float((rebuilt - expected).abs().max()) <= float(scale.float().abs().max()) * 8 * 2**-8
    assert centred.dtype == torch.int8 and int(centred.min()) >= -8 and int(centred.max()) <= 7
