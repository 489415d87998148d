"""SiLU-and-multiply: ``[..., 2 * I] -> [..., I]``, ``silu(gate) * up``.

Numerics follow ``octavo.models.layers.activation``: ``silu`` in float32
rounded to the input dtype, then the product in float32 rounded again (what
torch computes for ``F.silu(gate) * up`` in that dtype). Program ``(row,
chunk)`` handles ``BLOCK`` output columns of one row.

Reference: ``octavo.kernels.reference.silu_and_mul_reference``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo.kernels.triton_utils import cdiv, next_power_of_2

_MAX_BLOCK = 1024


@triton.jit
def silu_then_mul(gate32, up32, DTYPE: tl.constexpr):
    """``silu(gate) * up`` in float32, with silu rounded to ``DTYPE`` first (the
    reference's rounding steps); ``gate32`` and ``up32`` already hold ``DTYPE`` values."""
    silu = (gate32 / (1.0 + tl.exp(-gate32))).to(DTYPE)
    return silu.to(tl.float32) * up32


@triton.jit
def _silu_and_mul_kernel(out_ptr, x_ptr, stride_x, stride_out, INTERMEDIATE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < INTERMEDIATE
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + INTERMEDIATE + cols, mask=mask, other=0.0)
    out = silu_then_mul(gate.to(tl.float32), up.to(tl.float32), out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    intermediate = x.shape[-1] // 2
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty((*x.shape[:-1], intermediate), dtype=x.dtype, device=x.device)
    if rows.shape[0] == 0 or intermediate == 0:
        return out
    block = min(_MAX_BLOCK, next_power_of_2(intermediate))
    _silu_and_mul_kernel[(rows.shape[0], cdiv(intermediate, block))](
        out, rows, rows.stride(0), intermediate, INTERMEDIATE=intermediate, BLOCK=block, num_warps=4
    )
    return out
