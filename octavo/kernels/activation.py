"""Gated activations: ``[..., 2 * I] -> [..., I]``, ``act(gate) * up``.

``act`` is SiLU (``silu_and_mul``), exact GELU (``gelu_and_mul``) or its
tanh approximation (``gelu_tanh_and_mul``). Numerics follow the references
(``octavo.ops.reference``): the activation in float32 rounded to the input
dtype, then the product in float32 rounded again (what torch computes for
``act(gate) * up`` in that dtype). Program ``(row, chunk)`` handles
``BLOCK`` output columns of one row.
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


# The ACT codes of ``_gated_kernel`` (and of the kernels that fuse a gated
# activation: the GEMV, the fused MoE), by the activation's name.
SILU, GELU, GELU_TANH = 0, 1, 2
ACT_CODES = {"silu": SILU, "gelu": GELU, "gelu_tanh": GELU_TANH}
SQRT_1_2: tl.constexpr = tl.constexpr(0.7071067811865476)
SQRT_2_OVER_PI: tl.constexpr = tl.constexpr(0.7978845608028654)


@triton.jit
def _gelu(gate32, TANH: tl.constexpr):
    if TANH:
        inner = SQRT_2_OVER_PI * (gate32 + 0.044715 * gate32 * gate32 * gate32)
        inner = tl.minimum(tl.maximum(inner, -15.0), 15.0)  # tanh(15) is 1 in float32; exp stays finite
        tanh = 1.0 - 2.0 / (tl.exp(2.0 * inner) + 1.0)
        return 0.5 * gate32 * (1.0 + tanh)
    return 0.5 * gate32 * (1.0 + tl.math.erf(gate32 * SQRT_1_2))


@triton.jit
def act_then_mul(gate32, up32, ACT: tl.constexpr, DTYPE: tl.constexpr):
    """``act(gate) * up`` in float32 for an ACT code, the activation rounded to
    ``DTYPE`` first (the references' rounding); shared with the fused MoE kernel."""
    if ACT == 0:  # SILU
        return silu_then_mul(gate32, up32, DTYPE)
    return _gelu(gate32, ACT == 2).to(DTYPE).to(tl.float32) * up32


@triton.jit
def _gated_kernel(
    out_ptr, x_ptr, stride_x, stride_out, INTERMEDIATE: tl.constexpr, BLOCK: tl.constexpr, ACT: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < INTERMEDIATE
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + INTERMEDIATE + cols, mask=mask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    out = act_then_mul(gate, up, ACT, dtype)
    tl.store(out_ptr + row * stride_out + cols, out.to(dtype), mask=mask)


def _gated(x: torch.Tensor, act: int) -> torch.Tensor:
    intermediate = x.shape[-1] // 2
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty((*x.shape[:-1], intermediate), dtype=x.dtype, device=x.device)
    if rows.shape[0] == 0 or intermediate == 0:
        return out
    block = min(_MAX_BLOCK, next_power_of_2(intermediate))
    _gated_kernel[(rows.shape[0], cdiv(intermediate, block))](
        out, rows, rows.stride(0), intermediate, INTERMEDIATE=intermediate, BLOCK=block, ACT=act, num_warps=4
    )
    return out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """The ``silu_and_mul`` layer op."""
    return _gated(x, SILU)


def gelu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """The ``gelu_and_mul`` layer op (exact GELU)."""
    return _gated(x, GELU)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """The ``gelu_tanh_and_mul`` layer op (tanh-approximated GELU)."""
    return _gated(x, GELU_TANH)
