"""int4 from 1 to 1,024 tokens, one Llama-3.1-8B layer's four projections
(CUDA events, medians, microseconds): bf16 cuBLAS beside the GEMV (at 1 and
2 tokens: its default and two row groups), the tensor-core kernel (its
defaults, the old kernel's tiles, candidate tiles) and dequantize + cuBLAS
(dequantizer tile candidates). CUDA only:
``python benchmarks/int4_crossover.py``. Sets ``DEQUANT_MIN_TOKENS`` and the
defaults in ``octavo/kernels/quant/int4_mm_triton.py``; each tensor-core row
names its ``OCTAVO_INT4_MM_TILES`` value for an end-to-end try."""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F

from octavo.kernels.quant import int4, int4_triton
from octavo.kernels.quant import int4_mm_triton as mm

SHAPES = [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)]  # (K, N)
TOKENS = (1, 2, 16, 64, 128, 256, 512, 1024)
GEMV_MAX_TOKENS = 2  # the GEMV rows stop here (nan beyond)
# (block_m, block_n, split_k (0: automatic), group_m, num_warps, num_stages, block_k, swap_ab)
OLD_TILES = [mm.GroupedMmConfig(16, 64, 0, 8, 4, 4), mm.GroupedMmConfig(32, 64, 0, 8, 4, 4),
             mm.GroupedMmConfig(64, 128, 0, 8, 4, 3), mm.GroupedMmConfig(128, 128, 0, 8, 8, 3)]
# Spill-free and within shared memory on sm_90 (ptxas, offline).
NEW_TILES = [mm.GroupedMmConfig(m, n, 0, 8, w, st, k, swap) for m, n, k, w, st, swap in (
    (16, 64, 128, 4, 4, True), (16, 64, 256, 4, 4, True), (32, 128, 128, 4, 3, True), (64, 128, 256, 8, 3, False),
    (64, 256, 128, 8, 4, False), (128, 128, 128, 8, 4, False), (128, 256, 128, 8, 3, False))]
DEQUANT_TILES = [mm.DequantTile(r, k, w) for r, k, w in ((32, 128, 4), (32, 512, 4), (16, 1024, 8), (8, 1024, 4))]


def median_us(fn, iters: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    return statistics.median(times)


def layer_us(run, layers, m: int) -> float:
    """One layer's four projections at ``m`` tokens; nan where the config cannot run
    (shared memory), -1 where its result is wrong (relative L2 error over 1e-2)."""
    total = 0.0
    for (k, _), (dense, q) in zip(SHAPES, layers):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        try:
            total += median_us(lambda: run(x, dense, q))
            weight = dense.float() if run is bf16_cublas else int4.dequantize_int4(*q, 128, torch.float32)
            expected = x.float() @ weight.t()
        except Exception:  # noqa: BLE001 -- a tile the GPU cannot take: shown as nan
            return float("nan")
        if ((run(x, dense, q).float() - expected).norm() / expected.norm()) > 1e-2:
            return -1.0
    return total


def bf16_cublas(x, dense, q):
    return F.linear(x, dense)


# The GEMV's default and its two-row-group form (OCTAVO_INT4_GEMV_TILES values).
GEMV_CONFIGS = [("default", int4_triton.GEMV_CONFIG),
                ("4,8,4,1,2", int4_triton.GroupedGemvConfig(4, 8, 4, deferred=True, row_groups=2))]


def gemv_rows(x, q, config):
    if x.shape[0] > GEMV_MAX_TOKENS:
        raise ValueError("the GEMV rows stop at GEMV_MAX_TOKENS")  # shown as nan
    return int4_triton.grouped_gemv(x, *q, 128, None, 4, config)


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    layers = []
    for k, n in SHAPES:
        dense = (torch.randn(n, k, generator=gen) * 0.02).to("cuda", torch.bfloat16)
        layers.append((dense, int4.quantize_int4_rtn(dense, 128)))
    rows = [("bf16 cublas", bf16_cublas),
            ("tc_mm default", lambda x, d, q: mm.grouped_mm(x, *q, 128, None, 4))]
    rows += [(f"gemv {name}", lambda x, d, q, c=c: gemv_rows(x, q, c)) for name, c in GEMV_CONFIGS]
    rows += [(f"tc_mm {mm.mm_env_value(c)}", lambda x, d, q, c=c: mm.grouped_mm(x, *q, 128, None, 4, c))
             for c in OLD_TILES + NEW_TILES]
    rows += [(f"dequant {t.rows},{t.block_k},{t.num_warps}+cublas",
              lambda x, d, q, t=t: F.linear(x, mm.grouped_dequantize(*q, 128, 4, torch.bfloat16, t)))
             for t in DEQUANT_TILES]
    print("us, one layer's 4 projections (-1: wrong result, nan: cannot run); tc_mm rows: OCTAVO_INT4_MM_TILES=m,n,k,warps,stages,split (0: auto),swap;"
          " dequant rows: OCTAVO_INT4_DEQUANT_TILE=rows,block_k,warps; (x) = bf16 / row")
    print(f"{'path':<34}" + "".join(f"{m:>16}" for m in TOKENS))
    bf16 = {}
    for name, run in rows:
        line = f"{name:<34}"
        for m in TOKENS:
            us = layer_us(run, layers, m)
            bf16.setdefault(m, us)
            line += f"{us:9.1f} ({bf16[m] / us:.2f})"
        print(line, flush=True)


if __name__ == "__main__":
    main()
