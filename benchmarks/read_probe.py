"""A read-only probe of the one-token int4 GEMV's access pattern (round 42):
the packed words of a weight read exactly as ``int4_gemv_rows`` and
``int4_gemv_dp4a`` read them (``[rows, blocks, 16 words]`` a step), only
XORed together, so that ``gemv_shapes_gpu.py`` can time the reads alone
beside the GEMVs. Near the copy bandwidth: the GEMVs lose their time in
their arithmetic or its latency; at the GEMVs' figures: in the reads' tiling.
``probe:read_B_S_W`` is the path at ``B`` rows a program, ``S`` blocks a
step and ``W`` warps. Not a GEMV: its output is a checksum. Its loop is so
small that LLVM unrolls it (sm_90 at (4, 16, 4): four steps a turn, eight
128-bit loads a thread in flight against the GEMVs' two), so it bounds what
the reads could reach with more of them in flight."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import quant_paths as qp


@triton.jit
def _read_words_kernel(w_ptr, out_ptr, N, num_blocks, stride_wn, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = rows < N
    lanes = tl.arange(0, 16)
    w_rows = w_ptr + tl.where(mask_n, rows, 0).to(tl.int64)[:, None, None] * stride_wn + lanes[None, None, :]
    acc = tl.zeros((BLOCK_N, SPLIT, 16), dtype=tl.int32)
    for first in range(0, num_blocks, SPLIT):
        blocks = first + tl.arange(0, SPLIT)
        blocks = tl.where(blocks < num_blocks, blocks, 0)
        acc ^= tl.load(w_rows + (blocks * 16)[None, :, None])
    out = tl.sum(tl.sum(acc, axis=2), axis=1)
    tl.store(out_ptr + rows, out.to(tl.float32), mask=mask_n)


def read_words(qweight: torch.Tensor, block_n: int, split: int, num_warps: int) -> torch.Tensor:
    """The checksum of each row of ``qweight`` (int32 ``[N, K / 8]``, Octavo's int4 layout)."""
    num_out, num_words = qweight.shape
    out = torch.empty(num_out, dtype=torch.float32, device=qweight.device)
    _read_words_kernel[(triton.cdiv(num_out, block_n),)](
        qweight, out, num_out, num_words // 16, qweight.stride(0), BLOCK_N=block_n, SPLIT=split, num_warps=num_warps)
    return out


def probe_path(name: str) -> qp.Path:
    """``read_B_S_W`` -> a path over int4 weights that reads them at those tiles."""
    block_n, split, num_warps = (int(part) for part in name.split("_")[1:])
    path = qp.Path("int4", name, lambda w, c: lambda x: read_words(w[0], block_n, split, num_warps), 1)
    return path
