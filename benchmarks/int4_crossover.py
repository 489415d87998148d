"""int4 at decode batch sizes: the tensor-core kernel against dequantize +
cuBLAS, beside bf16 cuBLAS, one Llama-3.1-8B layer's four projections
(CUDA events, medians): ``python benchmarks/int4_crossover.py``. Sets
``DEQUANT_MIN_TOKENS`` in ``octavo/kernels/quant/int4_triton.py``."""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F

from octavo.kernels.quant import int4, int4_triton

SHAPES = [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)]  # (K, N)


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


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    layers = []
    for k, n in SHAPES:
        dense = (torch.randn(n, k, generator=gen) * 0.02).to("cuda", torch.bfloat16)
        layers.append((dense, int4.quantize_int4_rtn(dense, 128)))
    print("tokens   bf16 cublas   int4 tc_mm   int4 dequant+cublas  (us, one layer's 4 projections)")
    for m in (16, 64, 128, 256, 384, 512, 1024):
        xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for k, _ in SHAPES]
        bf16 = sum(median_us(lambda: F.linear(x, d)) for x, (d, _) in zip(xs, layers))
        tc = sum(median_us(lambda: int4_triton.grouped_mm(x, *q, 128, None, 4)) for x, (_, q) in zip(xs, layers))
        deq = sum(median_us(lambda: F.linear(x, int4_triton.grouped_dequantize(*q, 128, 4, torch.bfloat16)))
                  for x, (_, q) in zip(xs, layers))
        print(f"{m:6d} {bf16:13.1f} {tc:12.1f} {deq:20.1f}", flush=True)


if __name__ == "__main__":
    main()
