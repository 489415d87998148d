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

``rotary_and_cache`` does the same for the query and, in the same launch,
writes the rotated key and the value into the paged KV cache (the
attention backend's ``forward_with_rotary``): one kernel per layer fewer.

The ``rotary_embedding`` (``apply_rotary``) and ``rotary_and_cache``
layer ops on the GPU; references in ``octavo.ops.reference``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo.kernels.fp8_cast import cast_to, pre_round
from octavo.kernels.pdl import pdl_enabled, pdl_release, pdl_wait
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
def _cos_sin(positions_ptr, token, cos_sin_ptr, stride_cos_sin, max_position, HALF: tl.constexpr, HALF_PAD: tl.constexpr):
    """Token ``token``'s cos and sin rows ([1, HALF_PAD]), its position clamped to the table."""
    position = tl.load(positions_ptr + token).to(tl.int64)
    position = tl.minimum(tl.maximum(position, 0), max_position - 1)
    cols = tl.arange(0, HALF_PAD)
    col_mask = cols < HALF
    cos = tl.load(cos_sin_ptr + position * stride_cos_sin + cols, mask=col_mask, other=0.0)[None, :]
    sin = tl.load(cos_sin_ptr + position * stride_cos_sin + HALF + cols, mask=col_mask, other=0.0)[None, :]
    return cos, sin


@triton.jit
def _rotary_kernel(
    positions_ptr, q_ptr, k_ptr, cache_ptr, max_position,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_cache,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, KV_HEADS_PAD: tl.constexpr,
    HALF: tl.constexpr, HALF_PAD: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    cos, sin = _cos_sin(positions_ptr, token, cache_ptr, stride_cache, max_position, HALF, HALF_PAD)
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


@triton.jit
def _rotary_cache_kernel(
    positions_ptr, q_ptr, k_ptr, v_ptr, cos_sin_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr, max_position,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_cos_sin,
    stride_block, stride_slot, stride_head,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, KV_HEADS_PAD: tl.constexpr,
    HALF: tl.constexpr, HALF_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, PRE_ROUND: tl.constexpr,
    PDL: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    pdl_wait(PDL)  # q, k and v come from the kernel before
    pdl_release(PDL)  # a program a token: the attention kernel may be placed meanwhile
    cos, sin = _cos_sin(positions_ptr, token, cos_sin_ptr, stride_cos_sin, max_position, HALF, HALF_PAD)
    _rotate_heads(q_ptr + token * stride_qt, stride_qh, cos, sin, NUM_HEADS, HEADS_PAD, HALF, HALF_PAD)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:  # padding: nothing to cache
        return
    heads = tl.arange(0, KV_HEADS_PAD)
    cols = tl.arange(0, HALF_PAD)
    mask = (heads < NUM_KV_HEADS)[:, None] & (cols < HALF)[None, :]
    dest = (slot // BLOCK_SIZE) * stride_block + (slot % BLOCK_SIZE) * stride_slot
    dest_offsets = dest + heads[:, None] * stride_head + cols[None, :]
    key = k_ptr + token * stride_kt + heads[:, None] * stride_kh + cols[None, :]
    k1 = tl.load(key, mask=mask, other=0.0).to(tl.float32)
    k2 = tl.load(key + HALF, mask=mask, other=0.0).to(tl.float32)
    cache_dtype = k_cache_ptr.dtype.element_ty
    # Rounded once, straight to the cache's dtype: the same values the
    # unfused path stores when the cache has the activations' dtype.
    # (cast_to: an fp8 cache rounds the same in Triton's interpreter as on a GPU.)
    tl.store(k_cache_ptr + dest_offsets, cast_to(k1 * cos - k2 * sin, cache_dtype, PRE_ROUND), mask=mask)
    tl.store(k_cache_ptr + dest_offsets + HALF, cast_to(k2 * cos + k1 * sin, cache_dtype, PRE_ROUND), mask=mask)
    value = v_ptr + token * stride_vt + heads[:, None] * stride_vh + cols[None, :]
    v1 = tl.load(value, mask=mask).to(tl.float32)
    v2 = tl.load(value + HALF, mask=mask).to(tl.float32)
    tl.store(v_cache_ptr + dest_offsets, cast_to(v1, cache_dtype, PRE_ROUND), mask=mask)
    tl.store(v_cache_ptr + dest_offsets + HALF, cast_to(v2, cache_dtype, PRE_ROUND), mask=mask)


def rotary_and_cache(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    """One launch for rotary embedding and the KV-cache write: rotate ``query``
    [T, H, D] in place and store the rotated ``key`` and ``value`` [T, Hkv, D] at
    ``slot_mapping`` of ``kv_cache`` [2, blocks, block_size, Hkv, D] (negative
    slots skipped). ``key`` itself is left as it was. Returns ``query``."""
    if query.stride(-1) != 1 or key.stride(-1) != 1 or value.stride(-1) != 1:
        raise ValueError("rotary_and_cache needs the head dimension of query, key and value to be contiguous")
    num_tokens, num_heads, head_size = query.shape
    num_kv_heads = key.shape[1]
    if cos_sin_cache.dtype != torch.float32 or cos_sin_cache.stride(-1) != 1:
        cos_sin_cache = cos_sin_cache.float().contiguous()
    if num_tokens == 0:
        return query
    key_cache, value_cache = kv_cache[0], kv_cache[1]
    half = head_size // 2
    pdl = pdl_enabled(query.device, num_tokens)
    _rotary_cache_kernel[(num_tokens,)](
        positions, query, key, value, cos_sin_cache, key_cache, value_cache, slot_mapping, cos_sin_cache.shape[0],
        query.stride(0), query.stride(1), key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        cos_sin_cache.stride(0), key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads,
        HEADS_PAD=next_power_of_2(num_heads), KV_HEADS_PAD=next_power_of_2(num_kv_heads),
        HALF=half, HALF_PAD=next_power_of_2(half), BLOCK_SIZE=key_cache.shape[1], PRE_ROUND=pre_round(),
        PDL=pdl, num_warps=4, launch_pdl=pdl,
    )
    return query
