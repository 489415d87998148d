"""Rotary position embedding, GPT-NeoX "rotate half" layout, in place.

For a head ``x = [x1, x2]`` (halves of ``head_size // 2``) at position ``p``,
with ``cos_sin_cache[p] = [cos, sin]`` (float32, each ``head_size // 2``):
``x1' = x1 cos - x2 sin`` and ``x2' = x2 cos + x1 sin``, computed in float32
and rounded once to the input dtype (the reference rounds each product in
the input dtype, so low-precision results can differ by an ulp).

Program ``t`` rotates every query and key head of token ``t``, loading its
cos/sin row once. ``query``/``key`` are rotated in place and may be strided
views (e.g. of the fused qkv projection); their last dimension must be
contiguous. Positions are clamped to the table, so padded tokens with junk
positions stay in bounds.

Reference: ``octavo.kernels.reference.apply_rotary_reference``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo.kernels.triton_utils import next_power_of_2


@triton.jit
def _rotate_heads(
    ptr, stride_h, cos, sin,
    NUM_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
):
    heads = tl.arange(0, HEADS_PAD)
    cols = tl.arange(0, HALF_PAD)
    mask = (heads < NUM_HEADS)[:, None] & (cols < HALF)[None, :]
    first = ptr + heads[:, None] * stride_h + cols[None, :]
    x1 = tl.load(first, mask=mask, other=0.0)
    x2 = tl.load(first + HALF, mask=mask, other=0.0)
    x1_32, x2_32 = x1.to(tl.float32), x2.to(tl.float32)
    tl.store(first, (x1_32 * cos - x2_32 * sin).to(x1.dtype), mask=mask)
    tl.store(first + HALF, (x2_32 * cos + x1_32 * sin).to(x1.dtype), mask=mask)


@triton.jit
def _rotary_kernel(
    positions_ptr, q_ptr, k_ptr, cache_ptr, max_position,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_cache,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, KV_HEADS_PAD: tl.constexpr,
    HALF: tl.constexpr, HALF_PAD: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    position = tl.load(positions_ptr + token).to(tl.int64)
    position = tl.minimum(tl.maximum(position, 0), max_position - 1)
    cols = tl.arange(0, HALF_PAD)
    col_mask = cols < HALF
    cos = tl.load(cache_ptr + position * stride_cache + cols, mask=col_mask, other=0.0)[None, :]
    sin = tl.load(cache_ptr + position * stride_cache + HALF + cols, mask=col_mask, other=0.0)[None, :]
    _rotate_heads(q_ptr + token * stride_qt, stride_qh, cos, sin, NUM_HEADS, HEADS_PAD, HALF, HALF_PAD)
    _rotate_heads(k_ptr + token * stride_kt, stride_kh, cos, sin, NUM_KV_HEADS, KV_HEADS_PAD, HALF, HALF_PAD)


def apply_rotary(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor):
    """Rotate ``query`` [T, H, D] and ``key`` [T, Hkv, D] in place; returns them."""
    if query.stride(-1) != 1 or key.stride(-1) != 1:
        raise ValueError("rotary embedding needs the head dimension of query and key to be contiguous")
    num_tokens, num_heads, head_size = query.shape
    num_kv_heads = key.shape[1]
    if cos_sin_cache.dtype != torch.float32 or cos_sin_cache.stride(-1) != 1:
        cos_sin_cache = cos_sin_cache.float().contiguous()
    if num_tokens == 0:
        return query, key
    half = head_size // 2
    _rotary_kernel[(num_tokens,)](
        positions, query, key, cos_sin_cache, cos_sin_cache.shape[0],
        query.stride(0), query.stride(1), key.stride(0), key.stride(1), cos_sin_cache.stride(0),
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads,
        HEADS_PAD=next_power_of_2(num_heads), KV_HEADS_PAD=next_power_of_2(num_kv_heads),
        HALF=half, HALF_PAD=next_power_of_2(half), num_warps=4,
    )
    return query, key
