"""Grouped int4 / int8 weight-only linear layers in Triton (Octavo's packed
layout, see ``int4``): three paths, chosen by the number of tokens.

* ``_grouped_gemv_kernel`` (a few tokens, decode): each program streams
  ``BLOCK_N`` packed weight rows, ``BLOCKS`` layout blocks per step
  (``[BLOCK_N, BLOCKS, P]`` words: long contiguous runs), and for each bit
  plane multiplies the ``P`` values it holds by the matching ``P``
  consecutive activations, in float32 on the CUDA cores. A value becomes a
  float with one OR and one subtraction (``2**23 + q`` has ``q`` in its
  mantissa, so ``bits(0x4B000000 | q) - (2**23 + zero)`` is exactly ``q -
  zero``); the group's scale multiplies the partial sum, not each value.
  Where each layout block lies in one group, ``_grouped_gemv_deferred_kernel``
  (the config's ``deferred``) sums a block's planes unscaled, scales once
  per block and reduces across lanes only at the end.
* more tokens: the tensor-core kernel of ``int4_mm_triton`` (``grouped_mm``:
  natural-order dequantized tiles, one ``tl.dot`` per K step, split-K for
  skinny batches);
* from ``DEQUANT_MIN_TOKENS`` on: ``grouped_dequantize`` (``int4_mm_triton``)
  writes the dense weight once and cuBLAS multiplies.

Tile shapes and the two crossovers are parameters with defaults
(``GEMV_CONFIG``, ``mm_config``, ``GEMV_MAX_TOKENS``, ``DEQUANT_MIN_TOKENS``),
set from ``benchmarks/quant_sweep_gpu.py`` and ``benchmarks/int4_crossover.py``
on the H200; tuning runs override them from the environment
(``OCTAVO_INT4_GEMV_TILES``, ``OCTAVO_INT4_MM_TILES``,
``OCTAVO_INT4_DEQUANT_TILE``, ``OCTAVO_INT4_DEQUANT_MIN_TOKENS``). Every
kernel is tested against the torch reference through the interpreter.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from octavo.kernels.quant import int4 as layout
from octavo.kernels.quant.int4_mm_triton import (  # noqa: F401 -- re-exported: the launchers callers know
    DEQUANT_TILE, DequantTile, GroupedMmConfig, grouped_dequantize, grouped_mm, mm_config,
)
from octavo.kernels.triton_utils import ints_from_env, next_power_of_2

@dataclass(frozen=True)
class GroupedGemvConfig:
    block_n: int = 4
    blocks: int = 4  # layout blocks (16 words each) per step
    num_warps: int = 4
    # ``_grouped_gemv_deferred_kernel`` where each layout block lies in one
    # group (the common case): fewer instructions per weight value, one
    # cross-lane reduction per program. Chosen by the tile sweep on a GPU.
    deferred: bool = False


# Swept on the H200 (round 26): one 8B decoder layer's four GEMVs 406 -> 125 us.
GEMV_CONFIG = GroupedGemvConfig(block_n=4, blocks=8, num_warps=4, deferred=True)
GEMV_MAX_TOKENS = 2
# H200 round 27 (benchmarks/int4_crossover.py, one 8B layer's four projections):
# dequantize + cuBLAS ties the tensor-core kernel at 64 tokens and wins above
# (512 tokens: 625 against 1,387 us; bf16 cuBLAS 344).
DEQUANT_MIN_TOKENS = 64


@functools.cache
def dequant_min_tokens() -> int:
    """``OCTAVO_INT4_DEQUANT_MIN_TOKENS`` (tuning runs: where dequantize + cuBLAS takes over), else the default."""
    parts = ints_from_env("OCTAVO_INT4_DEQUANT_MIN_TOKENS", "tokens", (1,))
    return parts[0] if parts is not None else DEQUANT_MIN_TOKENS


@triton.jit
def _plane(words, j: tl.constexpr, BITS: tl.constexpr):
    """Plane ``j`` of packed ``words`` as float32 ``2**23 + q``."""
    q = (words >> (BITS * j)) & ((1 << BITS) - 1)
    return (q | 0x4B000000).to(tl.float32, bitcast=True)


@triton.jit
def _program_rows(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's output features (out-of-range ones read row 0) and token rows, with their masks."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_m = tl.arange(0, BLOCK_M)
    return offs_n, mask_n, tl.where(mask_n, offs_n, 0).to(tl.int64), offs_m, offs_m < M


@triton.jit
def _step_words(w_ptr, rows, stride_wn, k0, K, BLOCKS: tl.constexpr, P: tl.constexpr, PACK: tl.constexpr):
    """One GEMV step's packed words ``[BLOCK_N, BLOCKS, P]`` from input ``k0`` on,
    each block's first input and whether it lies inside ``K``."""
    block_start = k0 + tl.arange(0, BLOCKS) * (P * PACK)
    valid = block_start < K
    offsets = rows[:, None, None] * stride_wn + (block_start // PACK)[None, :, None] + tl.arange(0, P)[None, None, :]
    return tl.load(w_ptr + offsets, mask=valid[None, :, None], other=0), block_start, valid


@triton.jit
def _plane_inputs(x_ptr, offs_m, mask_m, stride_xm, first, valid, P: tl.constexpr):
    """The ``P`` activations each block's plane pairs with, from input ``first``: float32 ``[BLOCK_M, BLOCKS, P]``."""
    offsets = offs_m[:, None, None] * stride_xm + first[None, :, None] + tl.arange(0, P)[None, None, :]
    return tl.load(x_ptr + offsets, mask=mask_m[:, None, None] & valid[None, :, None], other=0.0).to(tl.float32)


@triton.jit
def _store_rows(out, b_ptr, out_ptr, rows, offs_m, offs_n, mask_m, mask_n, stride_om, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        out += tl.load(b_ptr + rows).to(tl.float32)[None, :]
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], out.to(out_ptr.dtype.element_ty),
             mask=mask_m[:, None] & mask_n[None, :])


@triton.jit(do_not_specialize=["M"])
def _grouped_gemv_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, b_ptr, out_ptr, M, N, K, group_size,
    stride_xm, stride_wn, stride_sn, stride_zn, stride_om,
    BITS: tl.constexpr, P: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCKS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    PACK: tl.constexpr = 32 // BITS
    offs_n, mask_n, rows, offs_m, mask_m = _program_rows(M, N, BLOCK_M, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCKS), dtype=tl.float32)
    for k0 in range(0, K, P * PACK * BLOCKS):
        w, block_start, valid = _step_words(w_ptr, rows, stride_wn, k0, K, BLOCKS, P, PACK)
        for j in tl.static_range(PACK):
            first = block_start + j * P
            group = first // group_size
            scale = tl.load(s_ptr + rows[:, None] * stride_sn + group[None, :], mask=valid[None, :], other=0.0)
            zero = tl.load(z_ptr + rows[:, None] * stride_zn + group[None, :], mask=valid[None, :], other=0)
            q = _plane(w, j, BITS) - (zero.to(tl.float32) + 8388608.0)[:, :, None]
            x = _plane_inputs(x_ptr, offs_m, mask_m, stride_xm, first, valid, P)
            acc += tl.sum(x[:, None, :, :] * q[None, :, :, :], axis=3) * scale.to(tl.float32)[None, :, :]
    _store_rows(tl.sum(acc, axis=2), b_ptr, out_ptr, rows, offs_m, offs_n, mask_m, mask_n, stride_om, HAS_BIAS)


@triton.jit(do_not_specialize=["M"])
def _grouped_gemv_deferred_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, b_ptr, out_ptr, M, N, K, group_size,
    stride_xm, stride_wn, stride_sn, stride_zn, stride_om,
    BITS: tl.constexpr, P: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCKS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """``_grouped_gemv_kernel`` for whole groups: a layout block's planes share
    one scale and zero, so its products are summed unscaled over the planes,
    scaled once, and kept per lane until the end (one reduction, not one per
    plane and step)."""
    PACK: tl.constexpr = 32 // BITS
    offs_n, mask_n, rows, offs_m, mask_m = _program_rows(M, N, BLOCK_M, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCKS, P), dtype=tl.float32)
    for k0 in range(0, K, P * PACK * BLOCKS):
        w, block_start, valid = _step_words(w_ptr, rows, stride_wn, k0, K, BLOCKS, P, PACK)
        group = block_start // group_size
        scale = tl.load(s_ptr + rows[:, None] * stride_sn + group[None, :], mask=valid[None, :], other=0.0)
        zero = tl.load(z_ptr + rows[:, None] * stride_zn + group[None, :], mask=valid[None, :], other=0)
        offset = (zero.to(tl.float32) + 8388608.0)[:, :, None]
        block_sum = tl.zeros((BLOCK_M, BLOCK_N, BLOCKS, P), dtype=tl.float32)
        for j in tl.static_range(PACK):
            x = _plane_inputs(x_ptr, offs_m, mask_m, stride_xm, block_start + j * P, valid, P)
            block_sum += x[:, None, :, :] * (_plane(w, j, BITS) - offset)[None, :, :, :]
        acc += block_sum * scale.to(tl.float32)[None, :, :, None]
    out = tl.sum(tl.sum(acc, axis=3), axis=2)
    _store_rows(out, b_ptr, out_ptr, rows, offs_m, offs_n, mask_m, mask_n, stride_om, HAS_BIAS)


@functools.cache
def gemv_config_from_env() -> GroupedGemvConfig | None:
    """``OCTAVO_INT4_GEMV_TILES=block_n,blocks,num_warps[,deferred]`` (tuning runs), else None."""
    parts = ints_from_env("OCTAVO_INT4_GEMV_TILES", "block_n,blocks,num_warps[,deferred]", (3, 4))
    if parts is None:
        return None
    return GroupedGemvConfig(*parts[:3], deferred=bool(parts[3]) if len(parts) > 3 else False)


def grouped_gemv(x, qweight, scales, zeros, group_size, bias, bits, config: GroupedGemvConfig | None = None):
    num_tokens, num_out, num_in = layout.linear_shapes(x, qweight, bits)
    config = config or gemv_config_from_env() or GEMV_CONFIG
    out = torch.empty(num_tokens, num_out, dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    planes = layout.plane_words(num_in, bits)
    whole_groups = group_size % (planes * (32 // bits)) == 0
    kernel = _grouped_gemv_deferred_kernel if config.deferred and whole_groups else _grouped_gemv_kernel
    kernel[(triton.cdiv(num_out, config.block_n),)](
        x, qweight, scales, zeros, bias if bias is not None else x, out, num_tokens, num_out, num_in, group_size,
        x.stride(0), qweight.stride(0), scales.stride(0), zeros.stride(0), out.stride(0),
        BITS=bits, P=planes, BLOCK_M=next_power_of_2(num_tokens), BLOCK_N=config.block_n,
        BLOCKS=config.blocks, HAS_BIAS=bias is not None, num_warps=config.num_warps,
    )
    return out


def grouped_linear(x, qweight, scales, zeros, group_size, bias, bits):
    """``x @ W.T + bias`` for Octavo's grouped layout, the kernel chosen by the token count."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    num_tokens = x2.shape[0]
    tensor_cores = layout.plane_words(x2.shape[1], bits) == 16
    if num_tokens <= GEMV_MAX_TOKENS:
        out = grouped_gemv(x2, qweight, scales, zeros, group_size, bias, bits)
    elif tensor_cores and num_tokens < dequant_min_tokens():
        out = grouped_mm(x2, qweight, scales, zeros, group_size, bias, bits)
    else:
        out = F.linear(x2, grouped_dequantize(qweight, scales, zeros, group_size, bits, x.dtype), bias)
    return out.reshape(*x.shape[:-1], -1)


def int4_linear(x, qweight, scales, zeros, group_size: int, bias):
    """The ``int4_linear`` layer op on a GPU."""
    return grouped_linear(x, qweight, scales, zeros, group_size, bias, 4)


def int8_grouped_linear(x, qweight, scales, zeros, group_size: int, bias):
    """The ``int8_grouped_linear`` layer op on a GPU."""
    return grouped_linear(x, qweight, scales, zeros, group_size, bias, 8)

