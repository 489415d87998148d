"""Merge two partial attentions of the same queries over disjoint key sets.

Each part is its normalised output ``o`` [H, Q, D] (any float dtype; head
dimension contiguous) and the natural log-sum-exp ``lse`` [H, Q] (float32)
of each row's scores. Over the union of the keys,
``out = (o_a e^(lse_a - m) + o_b e^(lse_b - m)) / (e^(lse_a - m) + e^(lse_b - m))``
with ``m = max(lse_a, lse_b)``; a row with no key in a part has ``lse = -inf``
there (weight 0), and a row with none in either comes out as zeros.

Program ``(query tile, head)`` reads both parts' rows once and writes the
merged rows, in the output's dtype, straight into ``out`` [Q, H, D] (the
token-major layout the attention layer returns): no float32 copies of the
parts, no transposition after. Reference:
``octavo.kernels.reference.merge_attention_parts_reference``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo.kernels.triton_utils import next_power_of_2

BLOCK_Q = 32


@triton.jit
def _merge_parts_kernel(
    out_ptr, a_ptr, b_ptr, lse_a_ptr, lse_b_ptr, num_queries,
    stride_out_t, stride_out_h, stride_a_h, stride_a_t, stride_b_h, stride_b_t, stride_lse_a_h, stride_lse_b_h,
    HEAD_SIZE: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_Q: tl.constexpr,
):
    head = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    dims = tl.arange(0, HEAD_PAD)
    row_ok = rows < num_queries
    mask = row_ok[:, None] & (dims < HEAD_SIZE)[None, :]
    lse_a = tl.load(lse_a_ptr + head * stride_lse_a_h + rows, mask=row_ok, other=float("-inf"))
    lse_b = tl.load(lse_b_ptr + head * stride_lse_b_h + rows, mask=row_ok, other=float("-inf"))
    top = tl.maximum(lse_a, lse_b)
    top = tl.where(top == float("-inf"), 0.0, top)  # no key in either part: both weights 0
    weight_a = tl.exp(lse_a - top)
    weight_b = tl.exp(lse_b - top)
    total = weight_a + weight_b
    total = tl.where(total == 0.0, 1.0, total)
    rows64 = rows.to(tl.int64)
    a = tl.load(a_ptr + head * stride_a_h + rows64[:, None] * stride_a_t + dims[None, :], mask=mask, other=0.0)
    b = tl.load(b_ptr + head * stride_b_h + rows64[:, None] * stride_b_t + dims[None, :], mask=mask, other=0.0)
    merged = (a.to(tl.float32) * (weight_a / total)[:, None]) + (b.to(tl.float32) * (weight_b / total)[:, None])
    out = out_ptr + rows64[:, None] * stride_out_t + head * stride_out_h + dims[None, :]
    tl.store(out, merged.to(out_ptr.dtype.element_ty), mask=mask)


def merge_attention_parts(
    first: tuple[torch.Tensor, torch.Tensor], second: tuple[torch.Tensor, torch.Tensor], out: torch.Tensor
) -> torch.Tensor:
    """Merge parts ``(o [H, Q, D], lse [H, Q])`` into ``out`` [Q, H, D]; returns ``out``."""
    (out_a, lse_a), (out_b, lse_b) = first, second
    num_heads, num_queries, head_size = out_a.shape
    if out.shape != (num_queries, num_heads, head_size):
        raise ValueError(f"out has shape {tuple(out.shape)}, expected {(num_queries, num_heads, head_size)}")
    for part in (out_a, out_b, out):
        if part.stride(-1) != 1:
            raise ValueError("the head dimension of every part and of out must be contiguous")
    if lse_a.stride(-1) != 1 or lse_b.stride(-1) != 1:
        lse_a, lse_b = lse_a.contiguous(), lse_b.contiguous()
    if num_queries == 0:
        return out
    _merge_parts_kernel[(triton.cdiv(num_queries, BLOCK_Q), num_heads)](
        out, out_a, out_b, lse_a, lse_b, num_queries,
        out.stride(0), out.stride(1), out_a.stride(0), out_a.stride(1), out_b.stride(0), out_b.stride(1),
        lse_a.stride(0), lse_b.stride(0),
        HEAD_SIZE=head_size, HEAD_PAD=max(16, next_power_of_2(head_size)), BLOCK_Q=BLOCK_Q,
    )
    return out
