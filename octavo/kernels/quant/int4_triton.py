"""Grouped int4 / int8 weight-only linear layers in Triton (Octavo's packed
layout, see ``int4``): three kernels, chosen by the number of tokens.

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
* ``_grouped_mm_kernel`` (more tokens): tiles of ``BLOCK_M x BLOCK_N``; per
  layout block, each plane is dequantized in registers to a ``[BLOCK_N,
  16]`` tile of the activation dtype and multiplied on the tensor cores by
  the 16 activations it pairs with (no value shuffling: that is what the
  layout is for). Skinny batches split K over ``SPLIT_K`` programs whose
  float32 partials a second launch sums (no atomics, no memset).
* many tokens (prefill): ``_grouped_dequant_kernel`` writes the dense
  weight once and cuBLAS multiplies (the dequantization is a small part of
  a large GEMM).

Tile shapes and the two crossovers are parameters with defaults
(``GEMV_CONFIG``, ``mm_config``, ``GEMV_MAX_TOKENS``, ``DEQUANT_MIN_TOKENS``),
set from ``benchmarks/quant_sweep_gpu.py`` on the H200. Every kernel is
tested against the torch reference through the interpreter.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from octavo.kernels.quant import int4 as layout
from octavo.kernels.tile_order import grouped_tile
from octavo.kernels.triton_utils import dot_dtype, dot_precision, ints_from_env, next_power_of_2

@dataclass(frozen=True)
class GroupedGemvConfig:
    block_n: int = 4
    blocks: int = 4  # layout blocks (16 words each) per step
    num_warps: int = 4
    # ``_grouped_gemv_deferred_kernel`` where each layout block lies in one
    # group (the common case): fewer instructions per weight value, one
    # cross-lane reduction per program. Chosen by the tile sweep on a GPU.
    deferred: bool = False


@dataclass(frozen=True)
class GroupedMmConfig:
    block_m: int
    block_n: int
    split_k: int = 1
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3


# Swept on the H200 (round 26): one 8B decoder layer's four GEMVs 406 -> 125 us.
GEMV_CONFIG = GroupedGemvConfig(block_n=4, blocks=8, num_warps=4, deferred=True)
GEMV_MAX_TOKENS = 2
# H200 round 27 (benchmarks/int4_crossover.py, one 8B layer's four projections):
# dequantize + cuBLAS ties the tensor-core kernel at 64 tokens and wins above
# (512 tokens: 625 against 1,387 us; bf16 cuBLAS 344).
DEQUANT_MIN_TOKENS = 64
DEQUANT_TILE = (32, 4)  # (rows, layout blocks) per program


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


@triton.jit(do_not_specialize=["M"])
def _grouped_mm_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, b_ptr, out_ptr, M, N, K, group_size,
    stride_xm, stride_wn, stride_sn, stride_zn, stride_om, stride_split,
    BITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr,
    WHOLE_GROUPS: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
):
    P: tl.constexpr = 16
    PACK: tl.constexpr = 32 // BITS
    BLOCK_IN: tl.constexpr = P * PACK
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    rows_m = tl.where(mask_m, offs_m, 0).to(tl.int64)
    rows_n = tl.where(mask_n, offs_n, 0).to(tl.int64)
    words = tl.arange(0, P)
    num_blocks = K // BLOCK_IN
    per_split = tl.cdiv(num_blocks, SPLIT_K)
    first_block = tl.program_id(1) * per_split
    last_block = tl.minimum(first_block + per_split, num_blocks)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for b in range(first_block, last_block):
        w = tl.load(w_ptr + rows_n[:, None] * stride_wn + b * P + words[None, :])
        if WHOLE_GROUPS:  # the block lies in one group: one scale and zero per row
            group = (b * BLOCK_IN) // group_size
            scale = tl.load(s_ptr + rows_n * stride_sn + group).to(tl.float32)
            zero = tl.load(z_ptr + rows_n * stride_zn + group).to(tl.float32) + 8388608.0
        for j in tl.static_range(PACK):
            first = b * BLOCK_IN + j * P
            if not WHOLE_GROUPS:
                group = first // group_size
                scale = tl.load(s_ptr + rows_n * stride_sn + group).to(tl.float32)
                zero = tl.load(z_ptr + rows_n * stride_zn + group).to(tl.float32) + 8388608.0
            weight = ((_plane(w, j, BITS) - zero[:, None]) * scale[:, None]).to(x_ptr.dtype.element_ty)
            x = tl.load(x_ptr + rows_m[:, None] * stride_xm + first + words[None, :])
            acc = tl.dot(x.to(DOT_DTYPE), tl.trans(weight.to(DOT_DTYPE)), acc, input_precision=PRECISION)
    mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rows_n).to(tl.float32)[None, :]
        tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:  # float32 partials [SPLIT_K, M, N]: _sum_splits_kernel finishes
        partial = out_ptr + tl.program_id(1) * stride_split + offs_m[:, None] * N + offs_n[None, :]
        tl.store(partial, acc, mask=mask)


@triton.jit(do_not_specialize=["M"])
def _sum_splits_kernel(
    ws_ptr, b_ptr, out_ptr, M, N, stride_split, stride_om,
    SPLIT_K: tl.constexpr, BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for split in tl.static_range(SPLIT_K):
        total += tl.load(ws_ptr + split * stride_split + row * N + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        total += tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_om + offs, total.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _grouped_dequant_kernel(
    w_ptr, s_ptr, z_ptr, out_ptr, N, K, group_size, stride_wn, stride_sn, stride_zn, stride_on,
    BITS: tl.constexpr, P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCKS: tl.constexpr,
):
    PACK: tl.constexpr = 32 // BITS
    BLOCK_IN: tl.constexpr = P * PACK
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    rows = tl.where(mask_n, offs_n, 0).to(tl.int64)
    block_start = (tl.program_id(1) * BLOCKS + tl.arange(0, BLOCKS)) * BLOCK_IN
    valid = block_start < K
    mask = mask_n[:, None, None] & valid[None, :, None]
    words = tl.arange(0, P)
    w = tl.load(w_ptr + rows[:, None, None] * stride_wn + (block_start // PACK)[None, :, None] + words[None, None, :],
                mask=mask, other=0)
    for j in tl.static_range(PACK):
        first = block_start + j * P
        group = first // group_size
        scale = tl.load(s_ptr + rows[:, None] * stride_sn + group[None, :], mask=valid[None, :], other=0.0)
        zero = tl.load(z_ptr + rows[:, None] * stride_zn + group[None, :], mask=valid[None, :], other=0)
        value = (_plane(w, j, BITS) - (zero.to(tl.float32) + 8388608.0)[:, :, None]) * scale.to(tl.float32)[:, :, None]
        out = out_ptr + rows[:, None, None] * stride_on + first[None, :, None] + words[None, None, :]
        tl.store(out, value.to(out_ptr.dtype.element_ty), mask=mask)


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 8
    return torch.cuda.get_device_properties(device).multi_processor_count


def mm_config(num_tokens: int, out_features: int, in_features: int, bits: int, device: torch.device) -> GroupedMmConfig:
    """Tiles for the tensor-core kernel: small M tiles split K until every SM
    has about two programs, each with at least four layout blocks."""
    if num_tokens <= 16:
        config = GroupedMmConfig(16, 64, num_warps=4, num_stages=4)
    elif num_tokens <= 64:
        config = GroupedMmConfig(32, 64, num_warps=4, num_stages=4)
    elif num_tokens <= 256:
        config = GroupedMmConfig(64, 128, num_warps=4, num_stages=3)
    else:
        config = GroupedMmConfig(128, 128, num_warps=8, num_stages=3)
    tiles = triton.cdiv(num_tokens, config.block_m) * triton.cdiv(out_features, config.block_n)
    num_blocks = in_features // (16 * (32 // bits))
    split = 1
    while tiles * split < 2 * _num_sms(device) and num_blocks // (2 * split) >= 4 and split < 16:
        split *= 2
    return GroupedMmConfig(config.block_m, config.block_n, split, config.group_m, config.num_warps, config.num_stages)


def _shapes(x: torch.Tensor, qweight: torch.Tensor, bits: int) -> tuple[int, int, int]:
    num_tokens, num_in = x.shape
    if qweight.shape[1] * (32 // bits) != num_in:
        raise ValueError(f"x has {num_in} features, qweight packs {qweight.shape[1] * (32 // bits)} ({bits}-bit)")
    return num_tokens, qweight.shape[0], num_in


@functools.cache
def gemv_config_from_env() -> GroupedGemvConfig | None:
    """``OCTAVO_INT4_GEMV_TILES=block_n,blocks,num_warps[,deferred]`` (tuning runs), else None."""
    parts = ints_from_env("OCTAVO_INT4_GEMV_TILES", "block_n,blocks,num_warps[,deferred]", (3, 4))
    if parts is None:
        return None
    return GroupedGemvConfig(*parts[:3], deferred=bool(parts[3]) if len(parts) > 3 else False)


def grouped_gemv(x, qweight, scales, zeros, group_size, bias, bits, config: GroupedGemvConfig | None = None):
    num_tokens, num_out, num_in = _shapes(x, qweight, bits)
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


def grouped_mm(x, qweight, scales, zeros, group_size, bias, bits, config: GroupedMmConfig | None = None):
    num_tokens, num_out, num_in = _shapes(x, qweight, bits)
    if layout.plane_words(num_in, bits) != 16:
        raise ValueError(f"the tensor-core kernel needs inputs in multiples of {16 * 32 // bits}, got {num_in}")
    config = config or mm_config(num_tokens, num_out, num_in, bits, x.device)
    out = torch.empty(num_tokens, num_out, dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    split = config.split_k
    target = out if split == 1 else torch.empty(split, num_tokens, num_out, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(num_tokens, config.block_m) * triton.cdiv(num_out, config.block_n), split)
    has_bias = bias is not None
    _grouped_mm_kernel[grid](
        x, qweight, scales, zeros, bias if has_bias else x, target, num_tokens, num_out, num_in, group_size,
        x.stride(0), qweight.stride(0), scales.stride(0), zeros.stride(0), out.stride(0), num_tokens * num_out,
        BITS=bits, BLOCK_M=config.block_m, BLOCK_N=config.block_n, SPLIT_K=split, GROUP_M=config.group_m,
        WHOLE_GROUPS=group_size % (16 * 32 // bits) == 0, HAS_BIAS=has_bias,
        DOT_DTYPE=dot_dtype(x.dtype), PRECISION=dot_precision(x.dtype),
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    if split > 1:
        block = min(1024, next_power_of_2(num_out))
        _sum_splits_kernel[(num_tokens, triton.cdiv(num_out, block))](
            target, bias if has_bias else x, out, num_tokens, num_out, num_tokens * num_out, out.stride(0),
            SPLIT_K=split, BLOCK=block, HAS_BIAS=has_bias, num_warps=4,
        )
    return out


def grouped_dequantize(qweight, scales, zeros, group_size, bits, dtype) -> torch.Tensor:
    """The dense ``[N, K]`` weight, written by one launch."""
    num_out, num_in = qweight.shape[0], qweight.shape[1] * (32 // bits)
    planes = layout.plane_words(num_in, bits)
    out = torch.empty(num_out, num_in, dtype=dtype, device=qweight.device)
    rows, blocks = DEQUANT_TILE
    grid = (triton.cdiv(num_out, rows), triton.cdiv(num_in, planes * (32 // bits) * blocks))
    _grouped_dequant_kernel[grid](
        qweight, scales, zeros, out, num_out, num_in, group_size,
        qweight.stride(0), scales.stride(0), zeros.stride(0), out.stride(0),
        BITS=bits, P=planes, BLOCK_N=rows, BLOCKS=blocks, num_warps=4,
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
    elif tensor_cores and num_tokens < DEQUANT_MIN_TOKENS:
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

