"""Fused RMSNorm, optionally with the residual add in the same pass.

Numerics follow the reference (``octavo.ops.reference.rms_norm``) step by
step, so that results match it to the rounding of a float32 reduction:

- with a residual, ``x + residual`` is formed in float32 and rounded to the
  input dtype (what torch's add in that dtype returns), and that rounded sum
  is both the second output and the norm's input;
- normalise in float32, round to the input dtype, then multiply by the
  weight in float32 and round to the output dtype (``result_type(weight, x)``).

``qk_rms_norm`` normalises every query and key head of a step (per-head
q/k norms: Qwen3, Gemma 3) in one launch, a program per head.

``post_norm_add_rms_norm_f32_scale`` (Gemma's sandwich layers) first
normalises ``x`` by a second weight (float32 scale, rounded to the dtype),
then adds the residual and normalises the sum as above: the norm after one
block and the norm before the next in one pass over the row.

One program per row; the row (hidden size up to a few thousand) is loaded
whole. Inputs may be 2-D or 3-D (e.g. per-head q/k norms on a strided view
of the fused qkv output); the last dimension must be contiguous.

The ``rms_norm`` and ``fused_add_rms_norm`` layer ops on the GPU;
references in ``octavo.ops.reference``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo.kernels.pdl import pdl_enabled, pdl_release, pdl_wait
from octavo.kernels.triton_utils import next_power_of_2


@triton.jit
def rms_normalized(x32, eps, HIDDEN: tl.constexpr):
    """``x / sqrt(mean(x**2) + eps)`` in float32 (masked columns hold 0)."""
    variance = tl.sum(x32 * x32, 0) / HIDDEN
    return x32 * tl.rsqrt(variance + eps)


@triton.jit
def scaled_norm(x, weight, eps, weight_offset, HIDDEN: tl.constexpr, SCALE_F32: tl.constexpr):
    """``x``'s row normalised and scaled, float32, rounded as the reference
    rounds (masked columns of ``x`` hold 0)."""
    normed = rms_normalized(x.to(tl.float32), eps, HIDDEN)
    if SCALE_F32:  # Gemma / OLMo 2: scale before rounding, by offset + weight
        return normed * (weight_offset + weight.to(tl.float32))
    return weight.to(tl.float32) * normed.to(x.dtype).to(tl.float32)  # Llama: round, then scale


@triton.jit
def _rms_norm_kernel(
    out_ptr, sum_ptr, x_ptr, residual_ptr, weight_ptr, pre_weight_ptr, eps, weight_offset,
    inner, stride_x0, stride_x1, stride_r0, stride_r1,
    HIDDEN: tl.constexpr, BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr, SCALE_F32: tl.constexpr,
    PRE_NORM: tl.constexpr, PDL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    outer_index, inner_index = row // inner, row % inner
    cols = tl.arange(0, BLOCK)
    mask = cols < HIDDEN
    # A row a program (one at batch 1): the next kernel (a GEMV) may start
    # fetching its weights at once.
    pdl_wait(PDL)
    pdl_release(PDL)
    x = tl.load(x_ptr + outer_index * stride_x0 + inner_index * stride_x1 + cols, mask=mask, other=0.0)
    in_dtype = x.dtype
    if PRE_NORM:  # the norm after a block, rounded to the dtype before the add (SCALE_F32 only)
        pre_weight = tl.load(pre_weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        x = (rms_normalized(x.to(tl.float32), eps, HIDDEN) * (weight_offset + pre_weight)).to(in_dtype)
    if HAS_RESIDUAL:
        residual = tl.load(
            residual_ptr + outer_index * stride_r0 + inner_index * stride_r1 + cols, mask=mask, other=0.0
        )
        x = (x.to(tl.float32) + residual.to(tl.float32)).to(in_dtype)
        tl.store(sum_ptr + row * HIDDEN + cols, x, mask=mask)
    out = scaled_norm(x, tl.load(weight_ptr + cols, mask=mask, other=0.0), eps, weight_offset, HIDDEN, SCALE_F32)
    tl.store(out_ptr + row * HIDDEN + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def _as_rows(x: torch.Tensor) -> tuple[torch.Tensor, int, int, int, int]:
    """(tensor, outer count, inner count, outer stride, inner stride) over rows."""
    if x.stride(-1) != 1 or x.dim() > 3:
        x = x.contiguous()
    if x.dim() == 1:
        return x, 1, 1, 0, 0
    if x.dim() == 2:
        return x, x.shape[0], 1, x.stride(0), 0
    return x, x.shape[0], x.shape[1], x.stride(0), x.stride(1)


def _launch(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
    weight_offset: float | None = None, pre_weight: torch.Tensor | None = None,
):
    """``weight_offset`` None: the Llama rounding (``rms_norm``); a number: ``rms_norm_f32_scale``;
    ``pre_weight``: ``x`` is first normalised by it (``post_norm_add_rms_norm_f32_scale``)."""
    hidden = x.shape[-1]
    out_dtype = torch.result_type(weight, x) if weight_offset is None else x.dtype
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    summed = torch.empty_like(x, memory_format=torch.contiguous_format) if residual is not None else out
    x_rows, outer, inner, stride_x0, stride_x1 = _as_rows(x)
    if residual is not None:
        residual_rows, _, _, stride_r0, stride_r1 = _as_rows(residual)
    else:
        residual_rows, stride_r0, stride_r1 = x_rows, 0, 0
    num_rows = outer * inner
    if num_rows == 0:
        return out, summed
    block = next_power_of_2(hidden)
    pdl = pdl_enabled(x.device, outer)
    _rms_norm_kernel[(num_rows,)](
        out, summed, x_rows, residual_rows, weight, pre_weight if pre_weight is not None else weight, eps,
        float(weight_offset or 0.0), inner, stride_x0, stride_x1, stride_r0, stride_r1,
        HIDDEN=hidden, BLOCK=block, HAS_RESIDUAL=residual is not None, SCALE_F32=weight_offset is not None,
        PRE_NORM=pre_weight is not None, PDL=pdl, launch_pdl=pdl,
        num_warps=min(16, max(1, block // 256)),
    )
    return out, summed


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The ``rms_norm`` layer op: ``weight * norm(x)`` over the last dimension."""
    return _launch(x, None, weight, eps)[0]


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """The ``fused_add_rms_norm`` layer op: ``(weight * norm(x + residual), x + residual)``."""
    if residual.shape != x.shape:
        raise ValueError(f"residual shape {tuple(residual.shape)} differs from x shape {tuple(x.shape)}")
    return _launch(x, residual, weight, eps)


def rms_norm_f32_scale(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float) -> torch.Tensor:
    """The ``rms_norm_f32_scale`` layer op: ``norm(x) * (weight_offset + weight)`` in float32, rounded once."""
    return _launch(x, None, weight, eps, weight_offset)[0]


def fused_add_rms_norm_f32_scale(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float
):
    """The ``fused_add_rms_norm_f32_scale`` layer op: ``(rms_norm_f32_scale(x + residual), x + residual)``."""
    if residual.shape != x.shape:
        raise ValueError(f"residual shape {tuple(residual.shape)} differs from x shape {tuple(x.shape)}")
    return _launch(x, residual, weight, eps, weight_offset)


def post_norm_add_rms_norm_f32_scale(
    x: torch.Tensor, residual: torch.Tensor, post_weight: torch.Tensor, weight: torch.Tensor, eps: float,
    weight_offset: float,
):
    """The ``post_norm_add_rms_norm_f32_scale`` layer op: ``rms_norm_f32_scale(x, post_weight)``
    added to ``residual``, then ``(rms_norm_f32_scale(sum, weight), sum)``: one launch for three ops."""
    if residual.shape != x.shape:
        raise ValueError(f"residual shape {tuple(residual.shape)} differs from x shape {tuple(x.shape)}")
    return _launch(x, residual, weight, eps, weight_offset, pre_weight=post_weight)


@triton.jit
def _qk_norm_row(out_ptr, x_ptr, weight_ptr, eps, weight_offset, HEAD: tl.constexpr, BLOCK: tl.constexpr,
                 SCALE_F32: tl.constexpr):
    """One head's row, normalised as ``_rms_norm_kernel`` does one row (no residual)."""
    cols = tl.arange(0, BLOCK)
    mask = cols < HEAD
    x = tl.load(x_ptr + cols, mask=mask, other=0.0)
    out = scaled_norm(x, tl.load(weight_ptr + cols, mask=mask, other=0.0), eps, weight_offset, HEAD, SCALE_F32)
    tl.store(out_ptr + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _qk_rms_norm_kernel(
    q_out_ptr, k_out_ptr, q_ptr, k_ptr, q_weight_ptr, k_weight_ptr, eps, weight_offset,
    num_heads, num_kv_heads, stride_qt, stride_qh, stride_kt, stride_kh,
    HEAD: tl.constexpr, BLOCK: tl.constexpr, SCALE_F32: tl.constexpr, PDL: tl.constexpr,
):
    # Program r: token r // (H + Hkv), then its query heads, then its key heads.
    row = tl.program_id(0)
    token = (row // (num_heads + num_kv_heads)).to(tl.int64)
    head = row % (num_heads + num_kv_heads)
    pdl_wait(PDL)  # q and k come from the qkv projection
    pdl_release(PDL)
    if head < num_heads:
        _qk_norm_row(q_out_ptr + (token * num_heads + head) * HEAD, q_ptr + token * stride_qt + head * stride_qh,
                     q_weight_ptr, eps, weight_offset, HEAD, BLOCK, SCALE_F32)
    else:
        kv_head = head - num_heads
        _qk_norm_row(k_out_ptr + (token * num_kv_heads + kv_head) * HEAD, k_ptr + token * stride_kt + kv_head * stride_kh,
                     k_weight_ptr, eps, weight_offset, HEAD, BLOCK, SCALE_F32)


def qk_rms_norm(
    query: torch.Tensor, key: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
    weight_offset: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``qk_rms_norm`` layer op: every query and key head normalised, one
    launch (Qwen3's and Gemma 3's per-head q/k norms were two). ``query``
    ``[T, H, D]`` and ``key`` ``[T, Hkv, D]`` may be strided views of the qkv
    projection (last dimension contiguous); ``weight_offset`` None rounds as
    ``rms_norm``, a number scales in float32 as ``rms_norm_f32_scale``."""
    if query.stride(-1) != 1 or key.stride(-1) != 1:
        raise ValueError("qk_rms_norm needs the head dimension of query and key to be contiguous")
    (num_tokens, num_heads, head_size), num_kv_heads = query.shape, key.shape[1]
    dtype = lambda x, w: torch.result_type(w, x) if weight_offset is None else x.dtype  # noqa: E731
    q_out = torch.empty(query.shape, dtype=dtype(query, q_weight), device=query.device)
    k_out = torch.empty(key.shape, dtype=dtype(key, k_weight), device=key.device)
    if num_tokens == 0:
        return q_out, k_out
    block = next_power_of_2(head_size)
    pdl = pdl_enabled(query.device, num_tokens)
    _qk_rms_norm_kernel[(num_tokens * (num_heads + num_kv_heads),)](
        q_out, k_out, query, key, q_weight, k_weight, eps, float(weight_offset or 0.0),
        num_heads, num_kv_heads, query.stride(0), query.stride(1), key.stride(0), key.stride(1),
        HEAD=head_size, BLOCK=block, SCALE_F32=weight_offset is not None, PDL=pdl, launch_pdl=pdl,
        num_warps=min(16, max(1, block // 256)),
    )
    return q_out, k_out
