"""The grouped int4 / int8 layout (``int4``) on the tensor cores and as a
dense weight, in Triton: two kernels that turn a tile's packed words into
values with one load of the words and no shuffles.

Word ``p`` of a layout block holds the block's inputs ``p + 16 j`` in its
plane ``j`` (``P = 16`` words a block where the inputs allow, else 1).

* ``_grouped_mm_kernel``: tiles of ``BLOCK_M x BLOCK_N``; each K step
  dequantizes ``BLOCK_K`` inputs of ``BLOCK_N`` rows into one tile and does
  ONE ``tl.dot`` with the matching activations: a plain GEMM loop whose word
  and activation loads Triton software-pipelines (``num_stages``, async
  copies), unlike the eight 16-deep products per 128 inputs it replaces.
  The tile is in word-major order (``int4_word_tile``): each thread joins
  the planes of the words it holds, so its values are consecutive (wide
  shared-memory stores), and the activations are permuted to match on the
  host (``word_major``: the sum over K does not care about its order). A
  value is one shift, one AND-OR and one FMA (``_plane_at_unit``), exact for
  16-bit scales (float32 ones: one rounding more); the blocks' scales are
  loaded a step ahead. Skinny batches
  split K over ``SPLIT_K`` programs whose float32 partials
  ``_sum_splits_kernel`` sums (no atomics, no memset).
* ``_grouped_dequant_kernel``: the dense ``[N, K]`` weight for cuBLAS in
  natural order (``_dequant_tile``: the words of ``BLOCKS`` blocks shifted
  out to ``[BLOCK_N, BLOCKS, PACK, P]``, which reshapes to ``BLOCK_K``
  consecutive inputs), each program writing ``BLOCK_N`` rows of ``BLOCK_K``
  values (16-byte coalesced stores); value ``(q - zero) * scale`` in float32,
  rounded once, bit for bit the torch reference.

``BLOCK_K`` is shrunk on the host until it divides ``K``, so neither kernel
masks along K. Tiles are parameters (``GroupedMmConfig``, ``DequantTile``)
with defaults for the H200 and overrides from the environment for tuning
runs (``OCTAVO_INT4_MM_TILES``, ``OCTAVO_INT4_DEQUANT_TILE``).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from octavo.kernels.quant import int4 as layout
from octavo.kernels.quant.int4_pairs_tile import group_pairs, pair_major, pair_major_tile, takes_pairs
from octavo.kernels.quant.int4_word_tile import group_scale, word_major, word_major_tile
from octavo.kernels.tile_order import program_tile
from octavo.kernels.triton_utils import (
    dot_dtype, dot_precision, interpreting, ints_from_env, next_power_of_2, runs_ptx,
)


@dataclass(frozen=True)
class GroupedMmConfig:
    block_m: int
    block_n: int
    split_k: int = 1  # 0: as many splits as fill the SMs (``auto_split``)
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    block_k: int = 128  # inputs per K step: a multiple of the layout block (128 for int4, 64 for int8)
    # Multiply W x^T: the weight rows take the tensor cores' 64-row side, so
    # batches of 16-32 tokens run on Hopper's wgmma instead of mma.sync.
    swap_ab: bool = False
    # The weight tile made in bfloat16 pairs (``int4_pairs_tile``; 4 bits, bfloat16, groups of 128+).
    pairs: bool = False


@dataclass(frozen=True)
class DequantTile:
    rows: int = 32
    block_k: int = 512  # consecutive inputs (values written) per row
    num_warps: int = 4


# Not swept yet: the old kernel's row tiles with one 128-input step
# (benchmarks/int4_crossover.py and quant_sweep_gpu.py pick the winners).
DEQUANT_TILE = DequantTile(32, 512, 4)


@triton.jit
def _dequant_tile(
    w_ptr, s_ptr, z_ptr, rows, stride_wn, stride_sn, stride_zn, k0, group_size,
    BITS: tl.constexpr, P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, WHOLE_GROUPS: tl.constexpr,
):
    """Inputs ``k0 .. k0 + BLOCK_K`` of weight rows ``rows`` (``k0`` at a layout
    block), dequantized in natural order: float32 ``[BLOCK_N, BLOCK_K]``."""
    PACK: tl.constexpr = 32 // BITS
    BLOCK_IN: tl.constexpr = P * PACK
    BLOCKS: tl.constexpr = BLOCK_K // BLOCK_IN
    blocks = tl.arange(0, BLOCKS)
    words = tl.load(w_ptr + rows[:, None, None] * stride_wn + (k0 // PACK + blocks * P)[None, :, None]
                    + tl.arange(0, P)[None, None, :])
    shifts = BITS * tl.arange(0, PACK)
    q = (words[:, :, None, :] >> shifts[None, None, :, None]) & ((1 << BITS) - 1)
    # 2**23 + q as a float32 from its bits (one OR): exact, no int -> float conversion.
    value = (q | 0x4B000000).to(tl.float32, bitcast=True)
    if WHOLE_GROUPS:  # each layout block lies in one group: one scale and zero per row and block
        group = ((k0 + blocks * BLOCK_IN) // group_size)[None, :, None, None]
    else:  # groups smaller than a block: one per plane (P inputs never straddle two)
        first = k0 + blocks[:, None] * BLOCK_IN + tl.arange(0, PACK)[None, :] * P
        group = (first // group_size)[None, :, :, None]
    scale = tl.load(s_ptr + rows[:, None, None, None] * stride_sn + group).to(tl.float32)
    zero = tl.load(z_ptr + rows[:, None, None, None] * stride_zn + group).to(tl.float32) + 8388608.0
    return tl.reshape((value - zero) * scale, (BLOCK_N, BLOCK_K))


@triton.jit(do_not_specialize=["M"])
def _grouped_mm_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, b_ptr, out_ptr, M, N, K, group_size,
    stride_xm, stride_wn, stride_sn, stride_zn, stride_om, stride_split,
    BITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr, WHOLE_GROUPS: tl.constexpr, HAS_BIAS: tl.constexpr,
    DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr, SWAP_AB: tl.constexpr = False,
    PAIRS: tl.constexpr = False, ASM: tl.constexpr = False,
):
    offs_m, offs_n, mask_m, mask_n, rows_m, rows_n = program_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_k = tl.arange(0, BLOCK_K)
    num_steps = K // BLOCK_K
    per_split = tl.cdiv(num_steps, SPLIT_K)
    first_step = tl.program_id(1) * per_split
    last_step = tl.minimum(first_step + per_split, num_steps)
    BLOCKS: tl.constexpr = BLOCK_K // (16 * (32 // BITS))
    block_inputs = tl.arange(0, BLOCKS) * (16 * (32 // BITS))
    # The blocks' scales are loaded one step ahead (too narrow for the pipeliner's
    # async copies): their latency hides behind the step's products.
    # PAIRS: scale, bias are the pairs (scale, scale) and -(128 + zero) of int4_pairs_tile.
    first = first_step * BLOCK_K + block_inputs
    if PAIRS:
        bias, scale = group_pairs(s_ptr, z_ptr, rows_n, stride_sn, stride_zn, first, group_size)
    else:
        scale, bias = group_scale(s_ptr, z_ptr, rows_n, stride_sn, stride_zn, first, group_size, BITS)
    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(first_step, last_step):
        k0 = step * BLOCK_K
        ahead = tl.minimum(k0 + BLOCK_K, K - BLOCK_K) + block_inputs
        if PAIRS:
            next_bias, next_scale = group_pairs(s_ptr, z_ptr, rows_n, stride_sn, stride_zn, ahead, group_size)
            weight = pair_major_tile(w_ptr, rows_n, stride_wn, k0, bias, scale, BLOCK_N, BLOCK_K, ASM).to(DOT_DTYPE)
        else:
            next_scale, next_bias = group_scale(s_ptr, z_ptr, rows_n, stride_sn, stride_zn, ahead, group_size, BITS)
            weight = word_major_tile(w_ptr, s_ptr, z_ptr, rows_n, stride_wn, stride_sn, stride_zn, k0, group_size,
                                     scale, bias, BITS, BLOCK_N, BLOCK_K, WHOLE_GROUPS, DOT_DTYPE)
        x = tl.load(x_ptr + rows_m[:, None] * stride_xm + k0 + offs_k[None, :])
        if SWAP_AB:  # the weight's rows fill the tensor cores' 64-row side: skinny batches on Hopper's wgmma
            acc = tl.dot(weight, tl.trans(x.to(DOT_DTYPE)), acc, input_precision=PRECISION)
        else:
            acc = tl.dot(x.to(DOT_DTYPE), tl.trans(weight), acc, input_precision=PRECISION)
        scale, bias = next_scale, next_bias
    if SWAP_AB:
        acc = tl.trans(acc)
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
    w_ptr, s_ptr, z_ptr, out_ptr, N, group_size, stride_wn, stride_sn, stride_zn, stride_on,
    BITS: tl.constexpr, P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, WHOLE_GROUPS: tl.constexpr,
):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    rows = tl.where(mask_n, offs_n, 0).to(tl.int64)
    k0 = tl.program_id(1) * BLOCK_K
    value = _dequant_tile(w_ptr, s_ptr, z_ptr, rows, stride_wn, stride_sn, stride_zn, k0, group_size,
                          BITS, P, BLOCK_N, BLOCK_K, WHOLE_GROUPS)
    out = out_ptr + rows[:, None] * stride_on + k0 + tl.arange(0, BLOCK_K)[None, :]
    tl.store(out, value.to(out_ptr.dtype.element_ty), mask=mask_n[:, None])


@functools.cache
def num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 8
    return torch.cuda.get_device_properties(device).multi_processor_count


def fit_block_k(block_k: int, num_in: int, block_in: int) -> int:
    """``block_k`` halved until it divides ``num_in`` (at least one layout block
    of ``block_in`` inputs), so that the kernels need no masks along K."""
    if block_k < block_in or block_k % block_in:
        raise ValueError(f"block_k {block_k} is not a multiple of the {block_in}-input layout block")
    while num_in % block_k:
        block_k //= 2
    return max(block_k, block_in)


def auto_split(config: GroupedMmConfig, num_tokens: int, out_features: int, in_features: int,
               device: torch.device) -> int:
    """Splits of K until every SM has about two programs, each keeping at least four K steps."""
    tiles = triton.cdiv(num_tokens, config.block_m) * triton.cdiv(out_features, config.block_n)
    return split_k_for(tiles, in_features // config.block_k, device)


def split_k_for(tiles: int, steps: int, device: torch.device) -> int:
    """Splits of ``steps`` K steps over ``tiles`` output tiles: doubled until every
    SM has about two programs, each keeping at least four steps (at most 16)."""
    split = 1
    while tiles * split < 2 * num_sms(device) and steps // (2 * split) >= 4 and split < 16:
        split *= 2
    return split


def _default_tiles(num_tokens: int) -> GroupedMmConfig:
    """The old kernel's tiles (H200 round 27), one 128-input step: not swept for this kernel yet."""
    if num_tokens <= 16:
        return GroupedMmConfig(16, 64, 0, num_warps=4, num_stages=4)
    if num_tokens <= 64:
        return GroupedMmConfig(32, 64, 0, num_warps=4, num_stages=4)
    if num_tokens <= 256:
        return GroupedMmConfig(64, 128, 0, num_warps=4, num_stages=3)
    return GroupedMmConfig(128, 128, 0, num_warps=8, num_stages=3)


def mm_config(num_tokens: int, out_features: int, in_features: int, bits: int, device: torch.device) -> GroupedMmConfig:
    """Tiles for the tensor-core kernel (``OCTAVO_INT4_MM_TILES`` if set), split-K chosen by ``auto_split``."""
    config = mm_config_from_env() or _default_tiles(num_tokens)
    return _resolved(config, num_tokens, out_features, in_features, bits, device)


def _resolved(config: GroupedMmConfig, num_tokens: int, out_features: int, in_features: int, bits: int,
              device: torch.device) -> GroupedMmConfig:
    """``config`` with a ``block_k`` that divides the inputs and split-K chosen where it says 0."""
    config = dataclasses.replace(config, block_k=fit_block_k(config.block_k, in_features, 16 * (32 // bits)))
    if config.split_k == 0:
        config = dataclasses.replace(config, split_k=auto_split(config, num_tokens, out_features, in_features, device))
    return config


@functools.cache
def mm_config_from_env() -> GroupedMmConfig | None:
    """``OCTAVO_INT4_MM_TILES=block_m,block_n,block_k,num_warps,num_stages[,split_k[,swap_ab[,pairs]]]``
    (tuning runs; no split_k or 0: ``auto_split``), else None."""
    fields = "block_m,block_n,block_k,num_warps,num_stages[,split_k[,swap_ab[,pairs]]]"
    parts = ints_from_env("OCTAVO_INT4_MM_TILES", fields, (5, 6, 7, 8))
    if parts is None:
        return None
    block_m, block_n, block_k, num_warps, num_stages = parts[:5]
    split = parts[5] if len(parts) > 5 else 0
    swap = bool(parts[6]) if len(parts) > 6 else False
    pairs = bool(parts[7]) if len(parts) > 7 else False
    return GroupedMmConfig(block_m, block_n, split, 8, num_warps, num_stages, block_k, swap, pairs)


def mm_env_value(config: GroupedMmConfig) -> str:
    """``config`` as the value ``OCTAVO_INT4_MM_TILES`` takes."""
    c = config
    return (f"{c.block_m},{c.block_n},{c.block_k},{c.num_warps},{c.num_stages},{c.split_k},{int(c.swap_ab)},"
            f"{int(c.pairs)}")


@functools.cache
def dequant_tile_from_env() -> DequantTile | None:
    """``OCTAVO_INT4_DEQUANT_TILE=rows,block_k,num_warps`` (tuning runs), else None."""
    parts = ints_from_env("OCTAVO_INT4_DEQUANT_TILE", "rows,block_k,num_warps", (3,))
    return DequantTile(*parts) if parts is not None else None


def grouped_mm(x, qweight, scales, zeros, group_size, bias, bits, config: GroupedMmConfig | None = None):
    """``x @ W.T + bias`` on the tensor cores (inputs in whole 16-word layout blocks)."""
    num_tokens, num_out, num_in = layout.linear_shapes(x, qweight, bits)
    if layout.plane_words(num_in, bits) != 16:
        raise ValueError(f"the tensor-core kernel needs inputs in multiples of {16 * 32 // bits}, got {num_in}")
    config = _resolved(config or mm_config(num_tokens, num_out, num_in, bits, x.device),
                       num_tokens, num_out, num_in, bits, x.device)
    out = torch.empty(num_tokens, num_out, dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    split = config.split_k
    target = out if split == 1 else torch.empty(split, num_tokens, num_out, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(num_tokens, config.block_m) * triton.cdiv(num_out, config.block_n), split)
    has_bias = bias is not None
    # The pair tile's PTX runs on CUDA; the interpreter runs its plain twin.
    pairs = bool(config.pairs) and takes_pairs(x, scales, bits, group_size) and (runs_ptx(x.device) or interpreting())
    xw = pair_major(x) if pairs else word_major(x, bits)
    _grouped_mm_kernel[grid](
        xw, qweight, scales, zeros, bias if has_bias else x, target, num_tokens, num_out, num_in, group_size,
        xw.stride(0), qweight.stride(0), scales.stride(0), zeros.stride(0), out.stride(0), num_tokens * num_out,
        BITS=bits, BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, SPLIT_K=split,
        GROUP_M=config.group_m, WHOLE_GROUPS=group_size % (16 * 32 // bits) == 0, HAS_BIAS=has_bias,
        DOT_DTYPE=dot_dtype(x.dtype), PRECISION=dot_precision(x.dtype), SWAP_AB=config.swap_ab,
        PAIRS=pairs, ASM=runs_ptx(x.device), num_warps=config.num_warps, num_stages=config.num_stages,
    )
    if split > 1:
        sum_splits(target, bias, out)
    return out


def sum_splits(partials: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    """``out = partials.sum(0) (+ bias)``: float32 split-K partials ``[SPLIT_K, M, N]``, one launch."""
    split, num_tokens, num_out = partials.shape
    block = min(1024, next_power_of_2(num_out))
    _sum_splits_kernel[(num_tokens, triton.cdiv(num_out, block))](
        partials, bias if bias is not None else out, out, num_tokens, num_out, partials.stride(0), out.stride(0),
        SPLIT_K=split, BLOCK=block, HAS_BIAS=bias is not None, num_warps=4,
    )


def grouped_dequantize(qweight, scales, zeros, group_size, bits, dtype, tile: DequantTile | None = None) -> torch.Tensor:
    """The dense ``[N, K]`` weight, written by one launch."""
    num_out, num_in = qweight.shape[0], qweight.shape[1] * (32 // bits)
    planes = layout.plane_words(num_in, bits)
    block_in = planes * (32 // bits)
    tile = tile or dequant_tile_from_env() or DEQUANT_TILE
    block_k = fit_block_k(max(tile.block_k, block_in), num_in, block_in)
    out = torch.empty(num_out, num_in, dtype=dtype, device=qweight.device)
    _grouped_dequant_kernel[(triton.cdiv(num_out, tile.rows), num_in // block_k)](
        qweight, scales, zeros, out, num_out, group_size,
        qweight.stride(0), scales.stride(0), zeros.stride(0), out.stride(0),
        BITS=bits, P=planes, BLOCK_N=tile.rows, BLOCK_K=block_k, WHOLE_GROUPS=group_size % block_in == 0,
        num_warps=tile.num_warps,
    )
    return out
