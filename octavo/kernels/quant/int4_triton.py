"""Grouped int4 / int8 weight-only linear layers in Triton (Octavo's packed
layout, see ``int4``): four paths, chosen by the number of tokens
(``grouped_linear``).

* one token with whole groups (batch-1 decode of int4): ``int4_gemv_rows``,
  each plane's activations a vector broadcast over a program's rows, no
  barrier in its loop; with ``OCTAVO_INT4_GEMV_DP4A=1``, ``int4_gemv_dp4a``
  (activations in int8 per block of 128, 8-bit dot products: W4A8);
* the GEMV (a few tokens, or groups smaller than a block): each program streams
  one or two groups of ``BLOCK_N`` packed weight rows, ``BLOCKS`` layout
  blocks per step (``[BLOCK_N, BLOCKS, P]`` words: long contiguous runs),
  and for each bit plane multiplies the ``P`` values it holds by the
  matching ``P`` consecutive activations, in float32 on the CUDA cores. A
  value becomes a float with one OR and one subtraction (``2**23 + q`` has
  ``q`` in its mantissa, so ``bits(0x4B000000 | q) - (2**23 + zero)`` is
  exactly ``q - zero``); where a layout block lies in one group (the
  config's ``deferred``) its planes are summed unscaled and scaled once.
  Two forms: ``_grouped_gemv_shared_kernel`` (the default, whole groups)
  loads each step's activations once for all the program's rows and shares
  them through shared memory; ``_grouped_gemv_kernel`` loads every operand in
  the product's shape (no barrier in its loop, but each activation once per
  row), for groups smaller than a block and row pairs. On the GPU the shared
  form is 1.55x faster (round 31); lanes are reduced once at the end in both.
* more tokens: the tensor-core kernel of ``int4_mm_triton`` (``grouped_mm``:
  natural-order dequantized tiles, one ``tl.dot`` per K step, split-K for
  skinny batches);
* from ``DEQUANT_MIN_TOKENS`` on: ``grouped_dequantize`` (``int4_mm_triton``)
  writes the dense weight once and cuBLAS multiplies.

Tile shapes and the two crossovers are parameters with defaults
(``GEMV_CONFIG``, ``mm_config``, ``GEMV_MAX_TOKENS``, ``DEQUANT_MIN_TOKENS``),
set from ``benchmarks/quant_sweep_gpu.py`` and ``benchmarks/int4_crossover.py``
on the H200; tuning runs override them from the environment
(``OCTAVO_INT4_GEMV_TILES``, ``OCTAVO_INT4_GEMV_MAX_TOKENS``, ``OCTAVO_INT4_MM_TILES``,
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

from octavo.env_switches import switch_from_env
from octavo.kernels.pdl import pdl_enabled, pdl_release, pdl_wait
from octavo.kernels.quant import int4 as layout
from octavo.kernels.quant import int4_gemv_dp4a as gemv_dp4a
from octavo.kernels.quant import int4_gemv_rows as gemv_rows
from octavo.kernels.quant.int4_mm_triton import (  # noqa: F401 -- re-exported: the launchers callers know
    DEQUANT_TILE, DequantTile, GroupedMmConfig, grouped_dequantize, grouped_mm, mm_config,
)
from octavo.kernels.triton_utils import ints_from_env, next_power_of_2

@dataclass(frozen=True)
class GroupedGemvConfig:
    block_n: int = 4
    blocks: int = 4  # layout blocks (16 words each) per step
    num_warps: int = 4
    # Scale once per layout block where each lies in one group (the common
    # case): fewer instructions per weight value. Else (and with False) each
    # plane is scaled by its own group's. Chosen by the tile sweep on a GPU.
    deferred: bool = False
    # Row groups of ``block_n`` a program owns (1 or 2): with 2, each
    # activation it loads and widens serves twice the weight values.
    row_groups: int = 1
    # ``_grouped_gemv_shared_kernel``: each step's activations loaded once for
    # all the program's rows (whole groups only, one row group).
    shared_inputs: bool = False


# Swept on the H200 (round 26): one 8B decoder layer's four GEMVs 406 -> 125 us
# (then the shared-activation form). The per-row form that replaced it measured
# 204 us there (round 30); side by side on an H100 (round 31): shared 133.7 us,
# per-row 207.3, per-row with two row groups 242.6.
GEMV_CONFIG = GroupedGemvConfig(block_n=4, blocks=8, num_warps=4, deferred=True, shared_inputs=True)
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


@functools.cache
def gemv_max_tokens() -> int:
    """``OCTAVO_INT4_GEMV_MAX_TOKENS`` (tuning runs: 0 sends every batch to the tensor cores), else the default."""
    parts = ints_from_env("OCTAVO_INT4_GEMV_MAX_TOKENS", "tokens", (1,))
    return parts[0] if parts is not None else GEMV_MAX_TOKENS


@triton.jit
def _plane(words, j: tl.constexpr, BITS: tl.constexpr):
    """Plane ``j`` of packed ``words`` as float32 ``2**23 + q``."""
    q = (words >> (BITS * j)) & ((1 << BITS) - 1)  # words uint32: a logical shift
    return (q | 0x4B000000).to(tl.float32, bitcast=True)


@triton.jit
def _store_rows(out, b_ptr, out_ptr, rows, offs_m, offs_n, mask_m, mask_n, stride_om, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        out += tl.load(b_ptr + rows).to(tl.float32)[None, :]
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], out.to(out_ptr.dtype.element_ty),
             mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _group_rows(base_ptr, rows, stride_n, m4, lane4, ALONG_LANES: tl.constexpr):
    """``[BLOCK_M, BLOCK_N, 1, P]`` pointers to ``rows`` of a row-major tensor: along
    the lanes (the packed words) or the same element for every lane (scales, zeros)."""
    row4 = rows[None, :, None, None] + 0 * m4
    return base_ptr + row4 * stride_n + (lane4 if ALONG_LANES else 0 * lane4)


@triton.jit
def _block_scales(s_rows, z_rows, group, valid):
    """A layout block's scale and ``2**23 + zero`` (what ``_plane`` values are offset by), float32."""
    scale = tl.load(s_rows + group, mask=valid, other=0.0).to(tl.float32)
    return scale, tl.load(z_rows + group, mask=valid, other=0).to(tl.float32) + 8388608.0


@triton.jit(do_not_specialize=["M"])
def _grouped_gemv_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, b_ptr, out_ptr, M, N, K, group_size,
    stride_xm, stride_wn, stride_sn, stride_zn, stride_om,
    BITS: tl.constexpr, P: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCKS: tl.constexpr,
    HAS_BIAS: tl.constexpr, ROW_GROUPS: tl.constexpr, PLANE_SCALES: tl.constexpr, PDL: tl.constexpr,
):
    """Each program streams ``ROW_GROUPS x BLOCK_N`` rows' packed words,
    ``BLOCKS`` layout blocks a step, and multiplies each plane's ``P``
    values by the ``P`` activations they pair with, in float32 on the CUDA
    cores; products are kept per lane and reduced once at the end. Where a
    block lies in one group (``PLANE_SCALES`` false) its planes share one
    scale and zero: summed unscaled over the planes, scaled once per block;
    else each plane takes its own group's.

    Every load is shaped ``[BLOCK_M, BLOCK_N, BLOCKS, P]``, the product's own
    shape, the dimensions it does not vary along broadcast by its pointers
    (stride 0): each load then gets the packed words' layout, and nothing
    changes layout through shared memory inside the loop (the 2-D/3-D form
    had 16 barriers a step in its sm_90 SASS; ``tests/kernels/sass_loops.py``).
    The activations are re-read per output row from L1, not from DRAM.
    ``ROW_GROUPS=2``: a program owns two groups of ``BLOCK_N`` rows, and each
    activation loaded and widened serves both."""
    PACK: tl.constexpr = 32 // BITS
    pid = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    m4 = offs_m[:, None, None, None]
    block4 = tl.arange(0, BLOCKS)[None, None, :, None]
    lane4 = tl.arange(0, P)[None, None, None, :]
    offs_a = pid * (ROW_GROUPS * BLOCK_N) + tl.arange(0, BLOCK_N)
    offs_b = offs_a + BLOCK_N
    # Out-of-range rows read row 0 instead of masking every load; 64-bit row offsets.
    rows_a = tl.where(offs_a < N, offs_a, 0).to(tl.int64)
    rows_b = tl.where(offs_b < N, offs_b, 0).to(tl.int64)
    x_rows = x_ptr + m4 * stride_xm + 0 * rows_a[None, :, None, None] + lane4
    w_a = _group_rows(w_ptr, rows_a, stride_wn, m4, lane4, True)
    w_b = _group_rows(w_ptr, rows_b, stride_wn, m4, lane4, True)
    s_a = _group_rows(s_ptr, rows_a, stride_sn, m4, lane4, False)
    s_b = _group_rows(s_ptr, rows_b, stride_sn, m4, lane4, False)
    z_a = _group_rows(z_ptr, rows_a, stride_zn, m4, lane4, False)
    z_b = _group_rows(z_ptr, rows_b, stride_zn, m4, lane4, False)
    acc_a = tl.zeros((BLOCK_M, BLOCK_N, BLOCKS, P), dtype=tl.float32)
    acc_b = acc_a
    pdl_wait(PDL)  # the activations come from the kernel before (octavo/kernels/pdl.py)
    for k0 in range(0, K, P * PACK * BLOCKS):
        block_start = k0 + block4 * (P * PACK)
        valid = block_start < K
        # A division by a run-time value: the group index is not seen as
        # contiguous along the blocks, so the scale and zero loads are not
        # vectorised along them in a layout of their own.
        group = block_start // group_size
        words_a = tl.load(w_a + block_start // PACK, mask=valid, other=0).to(tl.uint32, bitcast=True)
        scale_a, offset_a = _block_scales(s_a, z_a, group, valid)
        sum_a = tl.zeros((BLOCK_M, BLOCK_N, BLOCKS, P), dtype=tl.float32)
        if ROW_GROUPS == 2:
            words_b = tl.load(w_b + block_start // PACK, mask=valid, other=0).to(tl.uint32, bitcast=True)
            scale_b, offset_b = _block_scales(s_b, z_b, group, valid)
            sum_b = sum_a
        for j in tl.static_range(PACK):
            x = tl.load(x_rows + block_start + j * P, mask=(m4 < M) & valid, other=0.0).to(tl.float32)
            if PLANE_SCALES:  # groups smaller than a block: this plane's own
                group = (block_start + j * P) // group_size
                scale_a, offset_a = _block_scales(s_a, z_a, group, valid)
                sum_a += x * (_plane(words_a, j, BITS) - offset_a) * scale_a
            else:
                sum_a += x * (_plane(words_a, j, BITS) - offset_a)
            if ROW_GROUPS == 2:
                if PLANE_SCALES:
                    scale_b, offset_b = _block_scales(s_b, z_b, group, valid)
                    sum_b += x * (_plane(words_b, j, BITS) - offset_b) * scale_b
                else:
                    sum_b += x * (_plane(words_b, j, BITS) - offset_b)
        acc_a += sum_a if PLANE_SCALES else sum_a * scale_a
        if ROW_GROUPS == 2:
            acc_b += sum_b if PLANE_SCALES else sum_b * scale_b
    pdl_release(PDL)
    _store_rows(tl.sum(tl.sum(acc_a, axis=3), axis=2), b_ptr, out_ptr, rows_a, offs_m, offs_a, mask_m, offs_a < N,
                stride_om, HAS_BIAS)
    if ROW_GROUPS == 2:
        _store_rows(tl.sum(tl.sum(acc_b, axis=3), axis=2), b_ptr, out_ptr, rows_b, offs_m, offs_b, mask_m,
                    offs_b < N, stride_om, HAS_BIAS)


@triton.jit(do_not_specialize=["M"])
def _grouped_gemv_shared_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, b_ptr, out_ptr, M, N, K, group_size,
    stride_xm, stride_wn, stride_sn, stride_zn, stride_om,
    BITS: tl.constexpr, P: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCKS: tl.constexpr,
    HAS_BIAS: tl.constexpr, PDL: tl.constexpr,
):
    """The deferred GEMV (whole groups: a block's planes summed unscaled,
    scaled once) with each plane's activations loaded once per step as
    ``[BLOCK_M, BLOCKS, P]`` and shared by the program's ``BLOCK_N`` rows,
    and each block's scale and zero once per row, where
    ``_grouped_gemv_kernel`` loads both in the product's shape (per row, per
    lane). Sharing costs layout changes through shared memory (16 barriers a
    step in its sm_90 loop at (4, 8, 4)); it was the form of round 26 (an 8B
    layer's four GEMVs 125 us on the H200, where the per-row form measured 204
    in round 30)."""
    PACK: tl.constexpr = 32 // BITS
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    rows = tl.where(mask_n, offs_n, 0).to(tl.int64)
    offs_m = tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    lanes = tl.arange(0, P)
    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCKS, P), dtype=tl.float32)
    pdl_wait(PDL)  # the activations come from the kernel before (octavo/kernels/pdl.py)
    for k0 in range(0, K, P * PACK * BLOCKS):
        block_start = k0 + tl.arange(0, BLOCKS) * (P * PACK)
        valid = block_start < K
        words = tl.load(w_ptr + rows[:, None, None] * stride_wn + (block_start // PACK)[None, :, None] + lanes[None, None, :],
                        mask=valid[None, :, None], other=0).to(tl.uint32, bitcast=True)
        group = block_start // group_size
        scale = tl.load(s_ptr + rows[:, None] * stride_sn + group[None, :], mask=valid[None, :], other=0.0)
        zero = tl.load(z_ptr + rows[:, None] * stride_zn + group[None, :], mask=valid[None, :], other=0)
        offset = (zero.to(tl.float32) + 8388608.0)[:, :, None]
        block_sum = tl.zeros((BLOCK_M, BLOCK_N, BLOCKS, P), dtype=tl.float32)
        for j in tl.static_range(PACK):
            first = block_start + j * P
            x = tl.load(x_ptr + offs_m[:, None, None] * stride_xm + first[None, :, None] + lanes[None, None, :],
                        mask=mask_m[:, None, None] & valid[None, :, None], other=0.0).to(tl.float32)
            block_sum += x[:, None, :, :] * (_plane(words, j, BITS) - offset)[None, :, :, :]
        acc += block_sum * scale.to(tl.float32)[None, :, :, None]
    pdl_release(PDL)
    _store_rows(tl.sum(tl.sum(acc, axis=3), axis=2), b_ptr, out_ptr, rows, offs_m, offs_n, mask_m, mask_n,
                stride_om, HAS_BIAS)


@functools.cache
def gemv_config_from_env() -> GroupedGemvConfig | None:
    """``OCTAVO_INT4_GEMV_TILES=block_n,blocks,num_warps[,deferred[,row_groups[,shared_inputs]]]``
    (tuning runs), else None."""
    fields = "block_n,blocks,num_warps[,deferred[,row_groups[,shared_inputs]]]"
    parts = ints_from_env("OCTAVO_INT4_GEMV_TILES", fields, (3, 4, 5, 6))
    if parts is None:
        return None
    return GroupedGemvConfig(*parts[:3], deferred=bool(parts[3]) if len(parts) > 3 else False,
                             row_groups=parts[4] if len(parts) > 4 else 1,
                             shared_inputs=bool(parts[5]) if len(parts) > 5 else False)


@functools.cache
def rows_gemv_enabled() -> bool:
    """``OCTAVO_INT4_GEMV_ROWS=0`` sends one-token calls to ``grouped_gemv`` instead of
    ``int4_gemv_rows`` (A/B runs)."""
    return switch_from_env("OCTAVO_INT4_GEMV_ROWS")


def grouped_gemv(x, qweight, scales, zeros, group_size, bias, bits, config: GroupedGemvConfig | None = None):
    num_tokens, num_out, num_in = layout.linear_shapes(x, qweight, bits)
    config = config or gemv_config_from_env() or GEMV_CONFIG
    out = torch.empty(num_tokens, num_out, dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    planes = layout.plane_words(num_in, bits)
    plane_scales = not config.deferred or group_size % (planes * (32 // bits)) != 0
    pdl = pdl_enabled(x.device, num_tokens)
    args = (x, qweight, scales, zeros, bias if bias is not None else x, out, num_tokens, num_out, num_in, group_size,
            x.stride(0), qweight.stride(0), scales.stride(0), zeros.stride(0), out.stride(0))
    tiles = dict(BITS=bits, P=planes, BLOCK_M=next_power_of_2(num_tokens), BLOCK_N=config.block_n, BLOCKS=config.blocks,
                 HAS_BIAS=bias is not None, PDL=pdl, num_warps=config.num_warps, launch_pdl=pdl)
    if config.shared_inputs and not plane_scales and config.row_groups == 1:
        _grouped_gemv_shared_kernel[(triton.cdiv(num_out, config.block_n),)](*args, **tiles)
    else:
        _grouped_gemv_kernel[(triton.cdiv(num_out, config.block_n * config.row_groups),)](
            *args, **tiles, ROW_GROUPS=config.row_groups, PLANE_SCALES=plane_scales,
        )
    return out


def grouped_linear(x, qweight, scales, zeros, group_size, bias, bits):
    """``x @ W.T + bias`` for Octavo's grouped layout, the kernel chosen by the token count."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    num_tokens = x2.shape[0]
    tensor_cores = layout.plane_words(x2.shape[1], bits) == 16
    if num_tokens <= gemv_max_tokens():
        if gemv_dp4a.takes(x2, group_size, bits):
            out = gemv_dp4a.int4_gemv_dp4a(x2, qweight, scales, zeros, group_size, bias)
        elif rows_gemv_enabled() and gemv_rows.takes(num_tokens, x2.shape[1], group_size, bits):
            out = gemv_rows.int4_gemv_rows(x2, qweight, scales, zeros, group_size, bias)
        else:
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

