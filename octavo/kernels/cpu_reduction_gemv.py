"""One-token linear layers as a product and a sum, for the CPU's compiled decode.

A batch-1 decode step on the CPU is its GEMVs: every weight read once, at
whatever rate the GEMV streams memory. MKL's GEMV (``F.linear``, ``mv``,
``x @ W.T``) reads the 135M Llama's matrices ([960, 576] ... [49152, 576])
at 11.5-12.4 GB/s on one thread of the 2-core dev machine and no faster on
two: it does not split matrices this narrow between threads. Written as
``(weight * x).sum(-1)``, inductor fuses the product into its reduction: one
C++ loop, vectorised along K and parallel over the rows, that reads each
weight once: 16.7 GB/s on one thread and 29.2 on two over the same 30
layers and LM head (benchmarks/RESULTS.md, "CPU compiled decode").

Eagerly the same expression would materialise the ``[N, K]`` product, so
outside a graph being compiled this is ``F.linear``. float32 only: in
bfloat16 the product would be rounded before the sum, unlike a GEMM's
float32 accumulation. The sum's order differs from MKL's (float32 rounding,
well inside the near-tie rule; the compiled-decode tests compare tokens).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def linear_reduction(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The ``linear`` op for one token (``x``: ``[1, K]``, ``weight``: ``[N, K]``) -> ``[1, N]``."""
    if not torch.compiler.is_compiling():
        return F.linear(x, weight, bias)
    out = (weight * x).sum(-1).unsqueeze(0)
    return out if bias is None else out + bias
