#!/usr/bin/env python
"""GPU checks and timings of Octavo's quantization kernels (issue 6).

Run from the repository root on the GPU machine (needs torch, triton and,
for the GGUF rows, the ``gguf`` package; nothing is downloaded):

    python benchmarks/quant_gpu.py            # checks + timings, ~2 min
    python benchmarks/quant_gpu.py --quick    # fewer timing iterations

1. Correctness of every GPU path against its torch reference at Llama-3.1-8B
   shapes: the int4 Triton dequant-GEMM (groups 32/64/128, act-order), fp8
   W8A8 (``torch._scaled_mm``), int8 W8A8 (``torch._int_mm``), the GGUF
   Triton dequantizer (bit-exact) and fused dequant-matmul for Q8_0, Q4_0,
   Q4_K, Q5_K, Q6_K, and the fp8 KV-cache write.
2. Timings of one decoder layer's linear layers (q/k/v, o, gate/up, down)
   at batch 1 and 256: bf16 vs fp8 (W8A8 and weight-only) vs int8 (W8A8 and
   weight-only) vs int4 (Triton) vs GGUF Q4_K. Weights are cycled through
   copies totalling > 256 MiB so that batch 1 reads them from HBM, not L2.
   Times are per call, replayed from a CUDA graph (GPU time; the eager time
   with Python launch overhead is in the JSON). The "floor" column is the
   bytes each layer must read (weights + activations) over 4.12 TB/s.

Prints a short table; with ``$OUT`` set, also writes ``quant_gpu.json`` there.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from octavo.kernels.quant import int4, scaled_mm  # noqa: E402
from octavo.kernels.quant.gguf_dequant import GGML_TYPES_BY_NAME, dequantize_gguf  # noqa: E402

SHAPES = [("qkv", 4096, 6144), ("o", 4096, 4096), ("gate_up", 4096, 28672), ("down", 14336, 4096)]  # (name, K, N)
BATCHES = (1, 256)
GGUF_CHECK_SHAPE = (4096, 4096)  # (N, K) for the GGUF correctness checks
COPY_BANDWIDTH = 4.12e12
RESULTS: dict = {"checks": [], "timings": []}


def check(name: str, got: torch.Tensor, expected: torch.Tensor, tolerance: float, exact: bool = False) -> None:
    if exact:
        ok, error = bool(torch.equal(got, expected)), 0.0 if torch.equal(got, expected) else float("inf")
    else:
        error = float((got.float() - expected.float()).norm() / expected.float().norm().clamp(min=1e-30))
        ok = error <= tolerance
    RESULTS["checks"].append({"name": name, "ok": ok, "rel_error": error, "tolerance": tolerance})
    print(f"  {'ok  ' if ok else 'FAIL'} {name:<48} rel err {error:.2e} (tol {tolerance:.0e})", flush=True)


def random_gguf(type_name: str, rows: int, cols: int, device) -> torch.Tensor:
    """Random bytes of ``type_name`` with sane fp16 scales (no inf/NaN)."""
    from octavo.kernels.quant.gguf_dequant import random_gguf_rows

    return random_gguf_rows(type_name, rows, cols).to(device)


def correctness(device: torch.device) -> None:
    from octavo.kernels.quant import gguf_triton, int4_triton

    print("correctness (GPU path vs torch reference):")
    torch.manual_seed(0)
    for name, k, n in SHAPES:
        w = (torch.randn(n, k, device=device) * 0.02).to(torch.bfloat16)
        for group in (128,) if name != "o" else (32, 64, 128):
            qweight, scales, zeros = int4.quantize_int4_rtn(w, group)
            dense = int4.dequantize_int4(qweight, scales, zeros, group, torch.bfloat16).float()
            for m in (1, 7, 256):
                x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
                got = int4_triton.int4_matmul(x, qweight, scales, zeros, group)
                check(f"int4 triton {name} g{group} M={m}", got, x.float() @ dense.t(), 1e-2)
    k, n = 4096, 4096
    w = (torch.randn(n, k, device=device) * 0.02).to(torch.bfloat16)
    qweight, scales, zeros = int4.quantize_int4_rtn(w, 128)
    perm = torch.randperm(k, device=device)
    x = torch.randn(5, k, device=device, dtype=torch.bfloat16)
    dense = int4.dequantize_int4(qweight, scales, zeros, 128, torch.bfloat16).float()
    got = int4_triton.int4_linear(x.index_select(-1, perm), qweight, scales, zeros, 128, None)  # as the int4 method does
    check("int4 act-order (input_perm) M=5", got, x[:, perm].float() @ dense.t(), 1e-2)

    print(f"  fp8 W8A8 supported: {scaled_mm.fp8_w8a8_supported(device)}; int8 W8A8 supported: {scaled_mm.int8_w8a8_supported(device)}")
    for m in (1, 17, 256):
        x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        dense = x.float() @ w.float().t()
        if scaled_mm.fp8_w8a8_supported(device):
            qw, ws = scaled_mm.quantize_fp8_per_channel(w)
            xq, xs = scaled_mm.quantize_fp8_per_token(x)
            got = scaled_mm.fp8_w8a8_linear(x, qw, ws)
            check(f"fp8 W8A8 _scaled_mm vs reference M={m}", got, scaled_mm.w8a8_reference(xq, xs, qw, ws), 1e-2)
            check(f"fp8 W8A8 vs bf16 dense M={m}", got, dense, 6e-2)
        if scaled_mm.int8_w8a8_supported(device):
            qw, ws = scaled_mm.quantize_int8_per_channel(w)
            xq, xs = scaled_mm.quantize_int8_per_token(x)
            got = scaled_mm.int8_w8a8_linear(x, qw, ws)
            check(f"int8 W8A8 _int_mm vs reference M={m}", got, scaled_mm.w8a8_reference(xq, xs, qw, ws), 1e-2)

    for type_name in ("Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K"):
        t = GGML_TYPES_BY_NAME[type_name]
        raw = random_gguf(type_name, *GGUF_CHECK_SHAPE, device)
        reference = dequantize_gguf(raw, t)
        check(f"gguf {type_name} triton dequant (bit-exact)", gguf_triton.gguf_dequantize(raw, t, torch.float32), reference, 0.0, exact=True)
        for m in (1, 16):
            x = torch.randn(m, GGUF_CHECK_SHAPE[1], device=device, dtype=torch.bfloat16)
            check(f"gguf {type_name} fused matmul M={m}", gguf_triton.gguf_matmul(x, raw, t), x.float() @ reference.t(), 1e-2)

    from octavo.runtime.attention.torch_paged import write_kv_cache

    cache = torch.zeros(2, 8, 16, 8, 128, dtype=torch.float8_e4m3fn, device=device)
    key, value = torch.randn(20, 8, 128, device=device), torch.randn(20, 8, 128, device=device)
    slots = torch.randperm(128, device=device)[:20]
    write_kv_cache(key, value, cache, slots)
    stored = cache[0].view(-1, 8, 128)[slots].float()
    check("fp8 KV cache write (cuda)", stored, key.to(torch.float8_e4m3fn).float(), 0.0, exact=True)


def _time_eager(calls, iters: int) -> float:
    """Mean microseconds per call, launched from Python (includes launch overhead)."""
    for call in calls[:3]:
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(iters):
        calls[i % len(calls)]()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / iters


def _time_graph(calls, iters: int) -> float | None:
    """Mean microseconds per call replayed from a CUDA graph (GPU time, as a
    graph-captured decode step sees it); None if the calls cannot be captured."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for call in calls:
                call()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for call in calls:
                call()
    except Exception as exc:  # noqa: BLE001 -- report and fall back to eager timing
        print(f"  (graph capture failed: {type(exc).__name__}: {exc})")
        return None
    replays = max(1, iters // len(calls))
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (replays * len(calls))


def _methods(w: torch.Tensor, device: torch.device) -> dict:
    """name -> (weight tensors, fn(x, weights)) for one bf16 weight [N, K]."""
    from octavo.kernels.quant.gguf_triton import gguf_linear
    from octavo.kernels.quant.int4_triton import int4_linear

    fp8_w, fp8_s = scaled_mm.quantize_fp8_per_channel(w)
    int8_w, int8_s = scaled_mm.quantize_int8_per_channel(w)
    q4 = int4.quantize_int4_rtn(w, 128)
    q4k = random_gguf("Q4_K", w.shape[0], w.shape[1], device)  # values do not matter for speed
    methods = {
        "bf16": ((w,), lambda x, t: F.linear(x, t[0])),
        "fp8 weight-only": ((fp8_w, fp8_s), lambda x, t: scaled_mm.weight_only_linear(x, *t)),
        "int8 weight-only": ((int8_w, int8_s), lambda x, t: scaled_mm.weight_only_linear(x, *t)),
        "int4 g128 (triton)": (q4, lambda x, t: int4_linear(x, *t, 128, None)),
        "gguf Q4_K (triton)": ((q4k,), lambda x, t: gguf_linear(x, t[0], GGML_TYPES_BY_NAME["Q4_K"])),
    }
    if scaled_mm.fp8_w8a8_supported(device):
        methods["fp8 W8A8"] = ((fp8_w, fp8_s), lambda x, t: scaled_mm.fp8_w8a8_linear(x, *t))
    if scaled_mm.int8_w8a8_supported(device):
        methods["int8 W8A8"] = ((int8_w, int8_s), lambda x, t: scaled_mm.int8_w8a8_linear(x, *t))
    return methods


def timings(device: torch.device, iters: int) -> tuple[dict, dict]:
    """{(method, batch): {shape: microseconds}} for one decoder layer's linears,
    and the same for the memory floor."""
    table: dict = {}
    floors: dict = {}
    for name, k, n in SHAPES:
        w = (torch.randn(n, k, device=device) * 0.02).to(torch.bfloat16)
        for method, (tensors, fn) in _methods(w, device).items():
            nbytes = sum(t.numel() * t.element_size() for t in tensors)
            copies = [tensors] + [tuple(t.clone() for t in tensors) for _ in range((256 << 20) // nbytes)]
            for m in BATCHES:
                x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
                calls = [lambda c=c: fn(x, c) for c in copies]
                eager = _time_eager(calls, iters)
                graph = _time_graph(calls, iters)
                us = graph if graph is not None else eager
                table.setdefault((method, m), {})[name] = us
                floors.setdefault((method, m), {})[name] = (nbytes + 2 * m * (k + n)) / COPY_BANDWIDTH * 1e6
                RESULTS["timings"].append(
                    {"method": method, "batch": m, "shape": name, "K": k, "N": n, "us_graph": graph, "us_eager": eager, "weight_bytes": nbytes}
                )
            del copies
        torch.cuda.empty_cache()
    return table, floors


def print_table(table: dict, floors: dict) -> None:
    names = [s[0] for s in SHAPES]
    for m in BATCHES:
        print(f"\nbatch {m}: microseconds per linear layer (Llama-3.1-8B shapes, CUDA-graph replay), one decoder layer")
        print(f"  {'method':<20}" + "".join(f"{s:>10}" for s in names) + f"{'layer':>10}{'floor':>9}{'vs bf16':>9}")
        base = sum(table[("bf16", m)].values())
        for (method, batch), row in table.items():
            if batch != m:
                continue
            total = sum(row.values())
            floor = sum(floors[(method, batch)].values())
            print(f"  {method:<20}" + "".join(f"{row[s]:>10.1f}" for s in names) + f"{total:>10.1f}{floor:>9.1f}{base / total:>8.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer timing iterations")
    parser.add_argument("--skip-timings", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this script is for the GPU machine")
        return 1
    device = torch.device("cuda", 0)
    print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    correctness(device)
    if not args.skip_timings:
        table, floors = timings(device, 20 if args.quick else 100)
        print_table(table, floors)
    failed = [c["name"] for c in RESULTS["checks"] if not c["ok"]]
    print(f"\n{len(RESULTS['checks']) - len(failed)}/{len(RESULTS['checks'])} checks passed" + (f"; FAILED: {failed}" if failed else ""))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "quant_gpu.json").write_text(json.dumps(RESULTS, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
