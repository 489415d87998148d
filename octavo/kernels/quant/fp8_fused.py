"""fp8 W8A8 linear layers fed straight from the op before them: the
activation quantizer fused into the RMSNorm (with its residual add) and
into SiLU-and-mul, one launch each, then ``torch._scaled_mm`` (or, for
batches up to ``skinny_8bit.w8a8_max_tokens()``, the skinny tensor-core kernel).

Unfused, a W8A8 layer's input is written in the activation dtype by the
norm (or the gated activation), read back by the one-launch quantizer
(``fp8_triton.quantize_fp8_rows``), and the fp8 copy written again: at a
prefill of 8,192 tokens of Llama-3.1-8B about 0.9 GB a layer of traffic and
two launches that the fused forms do not pay (the gated activation's input,
``2 x 14,336`` values a token, is the largest).

Numerics are the composition's, step by step: the norm (or activation) is
computed as its own kernel computes it (``rms_norm.py``, ``activation.py``)
and rounded to the activation dtype, then quantized per token exactly as
``quantize_fp8_rows`` does (``scale = max(amax / 448, 1e-12)``, IEEE
division, round to nearest even). So the fused op quantizes the same values
to the same fp8 codes as the two launches it replaces.

One program per row, the whole row in registers (``builtin.FUSED_FP8_MAX_ROW``
values at most, 64 a thread at 16 warps; wider rows are declined and take
the composition). Rows are padded
to a multiple of 16 for ``_scaled_mm``: padding rows come out as zeros with
the smallest scale.

The ``fused_add_rms_norm_fp8_linear`` and ``silu_and_mul_fp8_linear`` layer
ops on CUDA, for the batches past the weight-only GEMV's
(``builtin.quant_gemv_max_tokens``); smaller batches take the composition
(the norm, then ``fp8_linear``'s GEMV).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo.kernels.activation import silu_then_mul
from octavo.kernels.fp8_cast import cast_to, pre_round
from octavo.kernels.quant import scaled_mm
from octavo.kernels.quant.skinny_8bit import w8a8_matmul
from octavo.kernels.rms_norm import rms_normalized
from octavo.kernels.triton_utils import cdiv, next_power_of_2

@triton.jit
def _store_quantized(v32, mask, q_row, scale_ptr, QMAX: tl.constexpr, MIN_SCALE: tl.constexpr, PRE_ROUND: tl.constexpr):
    """Quantize one row held in registers (masked values 0) and store it with its scale."""
    scale = tl.maximum(tl.max(tl.abs(v32), 0) / QMAX, MIN_SCALE)
    q = tl.clamp(tl.math.div_rn(v32, scale), -QMAX, QMAX)
    tl.store(q_row, cast_to(q, q_row.dtype.element_ty, PRE_ROUND), mask=mask)
    tl.store(scale_ptr, scale)


# M changes every step: not specialised on (a recompile mid-serving stalls).
@triton.jit(do_not_specialize=["M"])
def _add_rms_norm_quant_kernel(
    q_ptr, scale_ptr, sum_ptr, x_ptr, residual_ptr, weight_ptr, eps, M, stride_x, stride_r,
    HIDDEN: tl.constexpr, BLOCK: tl.constexpr, QMAX: tl.constexpr, MIN_SCALE: tl.constexpr, PRE_ROUND: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < HIDDEN
    live = cols < tl.where(row < M, HIDDEN, 0)  # padding rows read nothing: zeros, the smallest scale
    x = tl.load(x_ptr + row * stride_x + cols, mask=live, other=0.0)
    residual = tl.load(residual_ptr + row * stride_r + cols, mask=live, other=0.0)
    dtype = x.dtype
    summed = (x.to(tl.float32) + residual.to(tl.float32)).to(dtype)
    tl.store(sum_ptr + row * HIDDEN + cols, summed, mask=live)
    normed = rms_normalized(summed.to(tl.float32), eps, HIDDEN)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    # The norm's output as ``fused_add_rms_norm`` rounds it: round, scale, round.
    out = (weight * normed.to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    _store_quantized(out, mask, q_ptr + row * HIDDEN + cols, scale_ptr + row, QMAX, MIN_SCALE, PRE_ROUND)


@triton.jit(do_not_specialize=["M"])
def _silu_and_mul_quant_kernel(
    q_ptr, scale_ptr, x_ptr, M, stride_x,
    INTERMEDIATE: tl.constexpr, BLOCK: tl.constexpr, QMAX: tl.constexpr, MIN_SCALE: tl.constexpr,
    PRE_ROUND: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < INTERMEDIATE
    live = cols < tl.where(row < M, INTERMEDIATE, 0)
    gate = tl.load(x_ptr + row * stride_x + cols, mask=live, other=0.0)
    up = tl.load(x_ptr + row * stride_x + INTERMEDIATE + cols, mask=live, other=0.0)
    dtype = gate.dtype
    # ``silu_and_mul``'s value in the activation dtype (silu(0) * 0 = 0 where masked).
    out = silu_then_mul(gate.to(tl.float32), up.to(tl.float32), dtype).to(dtype).to(tl.float32)
    _store_quantized(out, mask, q_ptr + row * INTERMEDIATE + cols, scale_ptr + row, QMAX, MIN_SCALE, PRE_ROUND)


def _warps(block: int) -> int:
    return min(16, max(4, block // 512))


def _quantized_buffers(num_tokens: int, width: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, int]:
    rows = cdiv(max(num_tokens, 1), scaled_mm.SCALED_MM_ROW_MULTIPLE) * scaled_mm.SCALED_MM_ROW_MULTIPLE
    q = torch.empty(rows, width, dtype=scaled_mm.FP8_DTYPE, device=device)
    return q, torch.empty(rows, 1, dtype=torch.float32, device=device), rows


def add_rms_norm_quant_fp8(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``fused_add_rms_norm(x, residual, weight, eps)``'s normed rows quantized
    to fp8 per token: (fp8 ``[M', H]``, float32 scales ``[M', 1]``, the sum
    ``x + residual`` ``[M, H]``), ``M'`` = ``M`` rounded up to 16."""
    num_tokens, hidden = x.shape
    x, residual = (t if t.stride(-1) == 1 else t.contiguous() for t in (x, residual))
    q, scales, rows = _quantized_buffers(num_tokens, hidden, x.device)
    summed = torch.empty(num_tokens, hidden, dtype=x.dtype, device=x.device)
    block = next_power_of_2(hidden)
    _add_rms_norm_quant_kernel[(rows,)](
        q, scales, summed, x, residual, weight, eps, num_tokens, x.stride(0), residual.stride(0),
        HIDDEN=hidden, BLOCK=block, QMAX=scaled_mm.FP8_MAX, MIN_SCALE=scaled_mm.MIN_SCALE, PRE_ROUND=pre_round(),
        num_warps=_warps(block),
    )
    return q, scales, summed


def silu_and_mul_quant_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``silu_and_mul(x)`` quantized to fp8 per token: (fp8 ``[M', I]``,
    float32 scales ``[M', 1]``), ``M'`` = ``M`` rounded up to 16."""
    num_tokens, width = x.shape
    intermediate = width // 2
    if x.stride(-1) != 1:
        x = x.contiguous()
    q, scales, rows = _quantized_buffers(num_tokens, intermediate, x.device)
    block = next_power_of_2(intermediate)
    _silu_and_mul_quant_kernel[(rows,)](
        q, scales, x, num_tokens, x.stride(0),
        INTERMEDIATE=intermediate, BLOCK=block, QMAX=scaled_mm.FP8_MAX, MIN_SCALE=scaled_mm.MIN_SCALE,
        PRE_ROUND=pre_round(), num_warps=_warps(block),
    )
    return q, scales


def fused_add_rms_norm_fp8_linear(x, residual, norm_weight, eps, qweight, weight_scale, bias):
    """The ``fused_add_rms_norm_fp8_linear`` layer op: the norm and the
    quantizer in one launch, then ``_scaled_mm``; returns ``(out, x + residual)``."""
    xq, x_scale, summed = add_rms_norm_quant_fp8(x, residual, norm_weight, eps)
    return w8a8_matmul(xq, x_scale, qweight, weight_scale, bias, x.shape[0], x.dtype), summed


def silu_and_mul_fp8_linear(x, qweight, weight_scale, bias):
    """The ``silu_and_mul_fp8_linear`` layer op: SiLU-and-mul and the
    quantizer in one launch, then ``_scaled_mm``."""
    xq, x_scale = silu_and_mul_quant_fp8(x)
    return w8a8_matmul(xq, x_scale, qweight, weight_scale, bias, x.shape[0], x.dtype)
