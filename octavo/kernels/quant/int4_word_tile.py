"""The int4 (and int8) tensor-core kernel's weight tile made in float32
(``int4_mm_triton``): each value of a word's plane made in float32 from its
bits and scaled with one FMA, the planes joined per thread (word-major: a
thread's values consecutive, wide shared-memory stores), rounded to the dot's
dtype. ``word_major`` orders the activations to match (the sum over K does
not care about its order). ``int4_pairs_tile`` is the bfloat16-pair form.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _plane_at_unit(words, j: tl.constexpr, BITS: tl.constexpr):
    """Plane ``j`` of ``words`` as float32 ``2**E + q`` (E = 7 for 4 bits, 8 for
    8 bits): ``q`` shifted to the mantissa's units bit and the exponent ORed in.
    With so small an ``E``, ``v * scale`` and ``(2**E + zero) * scale`` are exact
    in float32 for 16-bit scales, so ``v * scale - (2**E + zero) * scale`` is
    the exact ``(q - zero) * scale`` (one FMA, fused or not)."""
    E: tl.constexpr = BITS // 4 + 6
    UNIT: tl.constexpr = 23 - E
    SHIFT: tl.constexpr = BITS * j - UNIT
    if SHIFT >= 0:
        moved = words >> SHIFT
    else:
        moved = words << (0 - SHIFT)
    return ((moved & (((1 << BITS) - 1) << UNIT)) | ((127 + E) << 23)).to(tl.float32, bitcast=True)


@triton.jit
def group_scale(s_ptr, z_ptr, rows, stride_sn, stride_zn, first, group_size, BITS: tl.constexpr):
    """Scale and ``-(2**E + zero) * scale`` (``_plane_at_unit``) of the groups holding inputs ``first``
    ``[BLOCKS]`` of ``rows``: float32 ``[BLOCK_N, BLOCKS, 1]``."""
    E: tl.constexpr = BITS // 4 + 6
    group = first // group_size
    scale = tl.load(s_ptr + rows[:, None] * stride_sn + group[None, :]).to(tl.float32)[:, :, None]
    zero = tl.load(z_ptr + rows[:, None] * stride_zn + group[None, :]).to(tl.float32)[:, :, None]
    return scale, -(zero + (1 << E)) * scale


@triton.jit
def _plane_scaled(words, j: tl.constexpr, scale, bias, groups, BITS: tl.constexpr, BLOCKS: tl.constexpr,
                  WHOLE_GROUPS: tl.constexpr, DTYPE: tl.constexpr):
    """Plane ``j`` of ``words`` ``[BLOCK_N, BLOCKS, 16]`` (inputs ``16 j .. 16 j + 15``
    of each layout block) dequantized; ``scale`` and ``bias`` are the blocks' own
    where whole groups cover them, else the plane loads its own (``groups``: where
    the scales are, ``(s_ptr, z_ptr, rows, stride_sn, stride_zn, k0, group_size)``)."""
    if not WHOLE_GROUPS:
        s_ptr, z_ptr, rows, stride_sn, stride_zn, k0, group_size = groups
        first = k0 + tl.arange(0, BLOCKS) * (16 * (32 // BITS)) + 16 * j
        scale, bias = group_scale(s_ptr, z_ptr, rows, stride_sn, stride_zn, first, group_size, BITS)
    return _plane_at_unit(words, j, BITS) * scale + bias


@triton.jit
def word_major_tile(w_ptr, s_ptr, z_ptr, rows, stride_wn, stride_sn, stride_zn, k0, group_size, scale, bias,
                     BITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, WHOLE_GROUPS: tl.constexpr,
                     DTYPE: tl.constexpr):
    """Inputs ``k0 .. k0 + BLOCK_K`` of weight rows ``rows`` in word-major order
    (``word_major``): ``[BLOCK_N, BLOCK_K]`` of ``DTYPE``. Each thread joins the
    planes of the words it holds, so its values are consecutive in the tile
    (wide shared-memory stores for the tensor cores, no shuffle)."""
    PACK: tl.constexpr = 32 // BITS
    BLOCKS: tl.constexpr = BLOCK_K // (16 * PACK)
    words = tl.load(w_ptr + rows[:, None, None] * stride_wn + (k0 // PACK + tl.arange(0, BLOCKS) * 16)[None, :, None]
                    + tl.arange(0, 16)[None, None, :])
    groups = (s_ptr, z_ptr, rows, stride_sn, stride_zn, k0, group_size)
    v0 = _plane_scaled(words, 0, scale, bias, groups, BITS, BLOCKS, WHOLE_GROUPS, DTYPE)
    v1 = _plane_scaled(words, 1, scale, bias, groups, BITS, BLOCKS, WHOLE_GROUPS, DTYPE)
    v2 = _plane_scaled(words, 2, scale, bias, groups, BITS, BLOCKS, WHOLE_GROUPS, DTYPE)
    v3 = _plane_scaled(words, 3, scale, bias, groups, BITS, BLOCKS, WHOLE_GROUPS, DTYPE)
    # Nested joins put plane bitreverse(i) at position i: joined in bit-reversed order, plane j lands at j.
    if PACK == 4:
        planes = tl.join(tl.join(v0, v2), tl.join(v1, v3))
    else:
        v4 = _plane_scaled(words, 4, scale, bias, groups, BITS, BLOCKS, WHOLE_GROUPS, DTYPE)
        v5 = _plane_scaled(words, 5, scale, bias, groups, BITS, BLOCKS, WHOLE_GROUPS, DTYPE)
        v6 = _plane_scaled(words, 6, scale, bias, groups, BITS, BLOCKS, WHOLE_GROUPS, DTYPE)
        v7 = _plane_scaled(words, 7, scale, bias, groups, BITS, BLOCKS, WHOLE_GROUPS, DTYPE)
        planes = tl.join(tl.join(tl.join(v0, v4), tl.join(v2, v6)), tl.join(tl.join(v1, v5), tl.join(v3, v7)))
    return tl.reshape(planes, (BLOCK_N, BLOCK_K)).to(DTYPE)


def word_major(x: torch.Tensor, bits: int) -> torch.Tensor:
    """The activations in the order ``word_major_tile`` yields the weight: within
    each layout block, input ``p + 16 j`` (word ``p``, plane ``j``) at ``p * pack + j``."""
    pack = 32 // bits
    num_tokens, num_in = x.shape
    blocks = x.reshape(num_tokens, num_in // (16 * pack), pack, 16)
    return blocks.transpose(2, 3).contiguous().reshape(num_tokens, num_in)
