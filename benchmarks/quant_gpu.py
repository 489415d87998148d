#!/usr/bin/env python
"""GPU checks and timings of Octavo's quantized GEMMs (issue 17), Llama-3.1-8B shapes.

Run from the repository root on the GPU machine (nothing is downloaded):

    python benchmarks/quant_gpu.py            # checks + timings, ~4 min
    python benchmarks/quant_gpu.py --quick    # fewer token counts
    python benchmarks/quant_gpu.py --quick --families int4,fp8   # those (and bf16) only

1. Correctness: every path of ``quant_paths`` (each kernel of each format's
   dispatch, the dispatch itself, and torch's built-ins) against the float32
   product with the format's dequantized weight, at 1, 7 and 300 tokens;
   weight-only paths within 1e-2 (relative L2), activation-quantizing (W8A8)
   paths within 8e-2; the fp8 KV-cache write and split-KV decode over an fp8
   cache with scales against torch.
2. Timings: one decoder layer's four projections (qkv, o, gate_up, down) at
   each token count, per path: GPU medians with the L2 flushed, replayed from
   a CUDA graph. Beside each format: bf16 cuBLAS (the baseline), and the
   floor -- the bytes the path must read (weights as stored, with scales and
   zero points, plus activations) over the copy bandwidth measured in the
   same run. ``*`` marks the fastest path of a format at a token count: the
   crossovers to set in the dispatch (``GEMV_MAX_TOKENS``,
   ``DEQUANT_MIN_TOKENS``, ``OCTAVO_QUANT_GEMV_MAX_TOKENS``).

Prints short tables; with ``$OUT`` set, also writes ``quant_gpu.json`` there.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import quant_paths as qp  # noqa: E402
from kernels_gpu import copy_bandwidth, time_us  # noqa: E402
from kernels_gpu_sweep import compile_in_pool  # noqa: E402

TOKENS = (1, 2, 4, 8, 16, 64, 256, 512, 2048)
QUICK_TOKENS = (1, 4, 16, 256, 2048)
CHECK_TOKENS = (1, 7, 300)
W8A8_PATHS = {
    "triton_quant+scaled_mm", "torch_quant+scaled_mm", "skinny_w8a8", "block_mm", "torch_blockwise_scaled_mm", "fbgemm_f8f8bf16_rowwise",
}
RESULTS: dict = {"checks": [], "timings": [], "unavailable": {}}


def say(line: str = "") -> None:
    print(line, flush=True)


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.float() - expected).norm() / expected.norm().clamp(min=1e-30))


def record_check(name: str, error: float, tolerance: float) -> None:
    ok = error <= tolerance
    RESULTS["checks"].append({"name": name, "ok": ok, "rel_error": error, "tolerance": tolerance})
    say(f"  {'ok  ' if ok else 'FAIL'} {name:<58} rel err {error:.2e} (tol {tolerance:.0e})")


def runnable(path: qp.Path, weights: tuple, x: torch.Tensor):
    """The path's function, or None (reason recorded once) when it does not run here."""
    if path.max_tokens is not None and x.shape[0] > path.max_tokens:
        return None
    try:
        fn = path.make(weights, None)
        fn(x)
        return fn
    except Exception as exc:  # noqa: BLE001 -- a built-in this torch lacks, a kernel that fails
        RESULTS["unavailable"].setdefault(path.label, f"{type(exc).__name__}: {str(exc)[:120]}")
        return None


def correctness() -> None:
    say("correctness (each path vs the float32 product with the dequantized weight, shape 'o'):")
    generator = torch.Generator().manual_seed(0)
    _, num_in, num_out = qp.SHAPES[1]
    for family in qp.FAMILIES:
        weights = qp.make_weights(family, num_out, num_in, generator)
        for path in [p for p in qp.all_paths() if p.family == family]:
            for num_tokens in CHECK_TOKENS:
                x = torch.randn(num_tokens, num_in, generator=generator).to(qp.DEVICE, qp.DTYPE)
                fn = runnable(path, weights, x)
                if fn is None:
                    continue
                tolerance = 8e-2 if path.name in W8A8_PATHS else 2e-2
                record_check(f"{path.label} M={num_tokens}", relative_error(fn(x), qp.reference(family, weights, x)), tolerance)
    kv_cache_checks()


# fp8 KV-cache check shapes: Llama-3.1-8B's attention (32 query heads, 8 KV heads of 128),
# two requests of ~1k and ~2k tokens in blocks of 16 (the CPU smoke test shrinks them).
KV_HEADS, KV_GROUP, KV_HEAD_SIZE, KV_SEQ_LENS, KV_BLOCKS = 8, 4, 128, (1000, 1990), 256


def kv_cache_checks() -> None:
    """fp8 KV cache with scales: the write and split-KV decode against torch."""
    from octavo.kernels.kv_cache_write import reshape_and_cache
    from octavo.kernels.paged_attention import AttentionParams, PagedBatch
    from octavo.kernels.reference import paged_attention_reference
    from octavo.kernels.split_kv_decode import SplitWorkspace, split_kv_decode
    from octavo.runtime.attention.torch_paged import write_kv_cache

    device, k_scale, v_scale, d = qp.DEVICE, 0.5, 2.0, KV_HEAD_SIZE
    key, value = torch.randn(40, KV_HEADS, d, device=device), torch.randn(40, KV_HEADS, d, device=device)
    slots = torch.randperm(KV_BLOCKS * 16, device=device)[:40]
    cache = torch.zeros(2, KV_BLOCKS, 16, KV_HEADS, d, dtype=torch.float8_e4m3fn, device=device)
    expected = cache.clone()
    reshape_and_cache(key, value, cache, slots, k_scale, v_scale)
    write_kv_cache(key, value, expected, slots, k_scale, v_scale)
    record_check("fp8 KV write with scales (bit-exact: 0)", float((cache.float() - expected.float()).abs().max()), 0.0)
    seq_lens = torch.tensor(KV_SEQ_LENS, dtype=torch.int32, device=device)
    blocks_per_seq = -(-max(KV_SEQ_LENS) // 16)
    table = torch.randperm(KV_BLOCKS, device=device)[: 2 * blocks_per_seq].to(torch.int32).reshape(2, blocks_per_seq)
    num_heads = KV_HEADS * KV_GROUP
    query = torch.randn(2, num_heads, d, device=device, dtype=qp.DTYPE)
    batch = PagedBatch(torch.tensor([0, 1, 2], dtype=torch.int32, device=device), seq_lens, table, 2)
    workspace = SplitWorkspace.allocate(2, num_heads, d, 8, device)
    params = AttentionParams(d**-0.5, k_scale=k_scale, v_scale=v_scale)
    out = split_kv_decode(query, cache, batch, params, workspace)
    scales = torch.tensor([k_scale, v_scale], device=device).reshape(2, 1, 1, 1, 1)
    ref = paged_attention_reference(query, cache.float() * scales, batch.query_start_loc, seq_lens, table, d**-0.5)
    record_check("split-KV decode over fp8 cache with scales", relative_error(out, ref.float()), 2e-2)


def time_layer(path: qp.Path, weights: dict, num_tokens: int) -> dict[str, float] | None:
    """The path's time per shape, or None where it does not run; a path that fails
    while timed (a CUDA-graph capture it cannot take) says so and the others go on."""
    times = {}
    for shape, num_in, _ in qp.SHAPES:
        x = torch.randn(num_tokens, num_in, device=qp.DEVICE, dtype=qp.DTYPE)
        fn = runnable(path, weights[shape], x)
        if fn is None:
            return None
        try:
            times[shape] = time_us(lambda fn=fn, x=x: fn(x), reps=20)
        except Exception as exc:  # noqa: BLE001 -- reported; one path must not end the timings
            message = str(exc).strip().replace("\n", " ")
            say(f"  {path.label} M={num_tokens} {shape}: FAILED <{type(exc).__name__}: {message[:500]}>")
            RESULTS["unavailable"].setdefault(path.label, f"timing failed: {type(exc).__name__}: {message[:120]}")
            return None
    return times


def timings(tokens: tuple[int, ...], bandwidth: float) -> None:
    generator = torch.Generator().manual_seed(1)
    for family in qp.FAMILIES:
        weights = {shape: qp.make_weights(family, n, k, generator) for shape, k, n in qp.SHAPES}
        for num_tokens in tokens:
            for path in [p for p in qp.all_paths() if p.family == family]:
                times = time_layer(path, weights, num_tokens)
                if times is None:
                    continue
                floor = sum(
                    (qp.weight_bytes(weights[s]) + 2 * num_tokens * (k + n)) / bandwidth * 1e6 for s, k, n in qp.SHAPES
                )
                RESULTS["timings"].append(
                    {"family": family, "path": path.name, "tokens": num_tokens, "us": times, "layer_us": sum(times.values()),
                     "floor_us": floor}
                )
        del weights
        torch.cuda.empty_cache()


def print_tables(tokens: tuple[int, ...]) -> None:
    rows = RESULTS["timings"]
    base = {r["tokens"]: r["layer_us"] for r in rows if r["family"] == "bf16" and r["path"] == "cublas"}
    say("\none decoder layer's projections, microseconds (CUDA-graph replay, L2 flushed); bf16 = bf16 cuBLAS in this run,"
        " floor = the path's bytes / copy bandwidth, vs bf16 = bf16 / path (above 1: faster)")
    for family in qp.FAMILIES:
        say(f"\n{family}:")
        say(f"  {'tokens':>6} {'path':<28}{'qkv':>9}{'o':>9}{'gate_up':>9}{'down':>9}{'layer':>10}{'bf16':>9}{'floor':>9}"
            f"{'vs bf16':>9}")
        for num_tokens in tokens:
            group = [r for r in rows if r["family"] == family and r["tokens"] == num_tokens]
            best = min((r["layer_us"] for r in group if r["path"] != "op"), default=None)
            for r in group:
                mark = "*" if r["layer_us"] == best else " "
                ratio = base.get(num_tokens, float("nan")) / r["layer_us"]
                say(f"  {num_tokens:>6} {r['path']:<27}{mark}" + "".join(f"{r['us'][s]:>9.1f}" for s, _, _ in qp.SHAPES)
                    + f"{r['layer_us']:>10.1f}{base.get(num_tokens, float('nan')):>9.1f}{r['floor_us']:>9.1f}{ratio:>8.2f}x")
    for label, reason in RESULTS["unavailable"].items():
        say(f"  (not timed: {label}: {reason})")


def precompile(tokens: tuple[int, ...]) -> None:
    jobs = [
        (p.family, p.name, m, None) for p in qp.all_paths() if p.family in qp.FAMILIES
        for m in tokens if p.max_tokens is None or m <= p.max_tokens
    ]
    compile_in_pool(qp.compile_job, jobs, say, time.perf_counter())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"token counts {QUICK_TOKENS} only")
    parser.add_argument("--skip-timings", action="store_true")
    parser.add_argument("--families", help=f"comma-separated, of {','.join(qp.FAMILIES)} (bf16, the baseline, always)")
    args = parser.parse_args()
    if args.families:
        chosen = {"bf16", *args.families.split(",")}
        unknown = chosen - set(qp.FAMILIES)
        if unknown:
            parser.error(f"unknown families {sorted(unknown)}")
        qp.FAMILIES = tuple(f for f in qp.FAMILIES if f in chosen)
    if not torch.cuda.is_available():
        say("no CUDA device: this script is for the GPU machine")
        return 1
    say(f"device: {torch.cuda.get_device_name(qp.DEVICE)}, torch {torch.__version__}")
    tokens = QUICK_TOKENS if args.quick else TOKENS
    if not args.skip_timings:
        precompile(tokens)
    correctness()
    if not args.skip_timings:
        bandwidth = copy_bandwidth()
        say(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s")
        timings(tokens, bandwidth)
        print_tables(tokens)
    failed = [c["name"] for c in RESULTS["checks"] if not c["ok"]]
    say(f"\n{len(RESULTS['checks']) - len(failed)}/{len(RESULTS['checks'])} checks passed" + (f"; FAILED: {failed}" if failed else ""))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "quant_gpu.json").write_text(json.dumps(RESULTS, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
