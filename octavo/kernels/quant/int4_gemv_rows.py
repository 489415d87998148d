"""The int4 GEMV for one token with whole groups, its loop free of bit-field
extracts and, where Triton lays the warps along the rows only (``TILES``), of
barriers (issue 17).

Octavo's layout (``int4``) packs a block of 128 inputs of a row into 16
words, plane ``j`` of word ``i`` holding input ``i + 16 j``. A program takes
``BLOCK_N`` rows and steps through K ``SPLIT`` blocks at a time: the words
as ``[BLOCK_N, SPLIT, 16]`` (Triton lays threads along the 16 lanes, then the
blocks, then the rows), each plane's activations as a ``[SPLIT, 16]`` vector
broadcast over the rows, so that with the warps along the rows nothing
changes layout through shared memory in the loop (the shared form of
``int4_triton`` had 16 barriers a step). With more rows than a warp's 8 a
thread holds several rows sharing its activations in registers, but the GPU
prefers one row a thread and more programs (``TILES``): what pays is the
cheaper value, not the reuse.

Two forms of the arithmetic. The default, for bfloat16 activations on CUDA,
works on bfloat16 pairs (``_WORD_DOT_BF16_ASM``): one ``lop3`` makes two
values of a word, one ``fma`` takes their zero off and one more multiplies
them by their activations' pair and accumulates (four products a lane in
bfloat16, then float32 per word: a product's rounding is the size of the
rounding of a dequantized bfloat16 weight, which the reference path has).
The float32 form (float16 activations, ROCm, and ``packed=0`` for
comparison) makes one value at a time: a byte shifted down, ``lop3`` masks a
nibble and ORs in the exponent (``2**23 + q``, or ``2**23 + 16 q`` for the
byte's high nibble, whose activation is divided by 16), the offset
subtracted before the product. LLVM would turn each mask into a bit-field
extract (two instructions, then the OR), so ``lop3`` is inline PTX on CUDA,
plain expressions elsewhere (the interpreter runs a plain twin of each form).
Blocks past K read block 0 with a zero scale, so the loop has no masked
loads; groups of 128 make the group index a shift. sm_90 SASS of the loop
(``tests/kernels/sass_loops.py``, 8 rows, 8 blocks, 8 warps): 3.9
instructions a weight value in pairs (3.4 with two rows a thread, sharing
the activations' pairs), 6.5 in float32 (7.7 in round 33 with masks and a
division), against 9.5 with 16 barriers for the shared form.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from octavo.kernels.pdl import pdl_enabled, pdl_release, pdl_wait
from octavo.kernels.quant import bf16_pairs
from octavo.kernels.quant.bf16_pairs import bf16_half
from octavo.kernels.triton_utils import interpreting, ints_from_env, runs_ptx


@dataclass(frozen=True)
class RowsTiles:
    block_n: int  # rows a program
    split: int  # consecutive 128-input blocks a step, one per slice (warps along them)
    num_warps: int
    packed: int = 1  # 1: two values an instruction in 16-bit pairs (CUDA); 0: one value in float32
    prefetch: int = 0  # 1: the next step's weights loaded before this step's arithmetic
    stages: int = 1  # past 1 (without prefetch): Triton pipelines the loop's loads through shared memory


# Swept on the H200 (round 35, bfloat16 pairs, one 8B layer's four GEMVs, L2
# flushed, graphs): 76.8 us at (8, 16, 8) against 81.3 at (8, 8, 8), 78.6 at
# (8, 4, 4); torch's tinygemm 83.1 in the same run. Round 33 (H100, float32
# form): one row a thread wins, parallelism over activation reuse.
# The loop is barrier-free where the warps lie along the rows only ((8, 8, 8),
# (16, 8, 8), (8, 16, 16); ``tests/kernels/sass_loops.py``). At (8, 16, 8)
# and (4, 8, 4) Triton puts warps along the blocks too, loads the activations
# in a layout of their own and converts them through shared memory: 8 barriers
# a step (sm_90: 219 instructions a step, 3.4 a value, 64 registers). It still
# won the sweep: the barriers are not what limits this GEMV (round 42).
TILES = RowsTiles(block_n=8, split=16, num_warps=8)


@functools.cache
def tiles_from_env() -> RowsTiles | None:
    """``OCTAVO_INT4_GEMV_ROWS_TILES=block_n,split,num_warps[,packed[,prefetch[,stages]]]`` (tuning runs),
    else None."""
    fields = "block_n,split,num_warps[,packed[,prefetch[,stages]]]"
    parts = ints_from_env("OCTAVO_INT4_GEMV_ROWS_TILES", fields, (3, 4, 5, 6))
    return None if parts is None else RowsTiles(*parts)


@triton.jit
def _nibble_bits(t, HIGH: tl.constexpr, ASM: tl.constexpr):
    """float32 bits of ``2**23 + (t & 15)``, or with ``HIGH`` of ``2**23 + (t & 240)``
    (16 times the byte's high nibble): ``lop3`` with mask and exponent."""
    if ASM:
        if HIGH:
            asm: tl.constexpr = "lop3.b32 $0, $1, 240, 1258291200, 0xEA;"
        else:
            asm: tl.constexpr = "lop3.b32 $0, $1, 15, 1258291200, 0xEA;"
        return tl.inline_asm_elementwise(asm, "=r,r", [t], dtype=tl.uint32, is_pure=True, pack=1)
    if HIGH:
        return (t & 0xF0) | 0x4B000000
    return (t & 0x0F) | 0x4B000000


# One word's eight values against their activations in bfloat16 pairs
# (``bf16_pairs``): nibbles ``j`` and ``j + 4`` (bits ``4 j`` and ``4 j + 16``) make
# one pair. Operands: $1 the word, $2-$5 the activation pairs ``(x_j, x_j+4)``,
# $6 the pair ``-(128 + zero)``; $0 the float32 sum.
_WORD_DOT_BF16_ASM = tl.constexpr(bf16_pairs.program(
    ".reg .b32 acc;",
    *(bf16_pairs.pair_product("$1", 4 * j, f"${2 + j}", "acc", "$6", first=j == 0) for j in range(4)),
    bf16_pairs.halves_sum("acc", "$0"),
))


@triton.jit
def _pair_bits(lo, hi, ASM: tl.constexpr):
    """Two bfloat16 tensors as one uint32 tensor of pairs, ``lo`` in the low half
    (one ``prmt``; LLVM's masks and shifts take two)."""
    lo = lo.to(tl.uint16, bitcast=True)
    hi = hi.to(tl.uint16, bitcast=True)
    if ASM:
        return tl.inline_asm_elementwise("mov.b32 $0, {$1, $2};", "=r,h,h", [lo, hi], dtype=tl.uint32, is_pure=True,
                                         pack=1)
    return lo.to(tl.uint32) | (hi.to(tl.uint32) << 16)


@triton.jit
def _pair_dot(t, pair, zero):
    """Plain-arithmetic twin of one pair's step in ``_WORD_DOT_BF16_ASM`` (float32 throughout)."""
    low = (t & 15).to(tl.float32) - zero
    high = ((t >> 16) & 15).to(tl.float32) - zero
    return low * bf16_half(pair, False) + high * bf16_half(pair, True)


@triton.jit
def _word_dot(words, p0, p1, p2, p3, zero, ASM: tl.constexpr):
    """``sum_j (q_j - zero) * x_j`` over each word's eight values, float32; ``p0``-``p3``
    the activations' bfloat16 pairs ``(x_j, x_j+4)``, ``zero`` a uint32 integer."""
    if ASM:
        neg_zero = zero | (zero << 16) | 0xC300C300  # the pair -(128 + zero)
        return tl.inline_asm_elementwise(_WORD_DOT_BF16_ASM, "=f,r,r,r,r,r,r", [words, p0, p1, p2, p3, neg_zero],
                                         dtype=tl.float32, is_pure=True, pack=1)
    z = zero.to(tl.float32)
    return (_pair_dot(words, p0, z) + _pair_dot(words >> 4, p1, z) + _pair_dot(words >> 8, p2, z)
            + _pair_dot(words >> 12, p3, z))


@triton.jit
def _float_block(words, x_block, zero, P: tl.constexpr, ASM: tl.constexpr):
    """One step's ``sum (q - zero) * x`` per word, a value at a time in float32: a byte
    shifted down, ``lop3`` makes ``2**23 + q`` (``2**23 + 16 q`` for the high nibble,
    whose activation is divided by 16), the offset subtracted before the product."""
    offset_low = (zero + 8388608.0)[:, :, None]
    offset_high = (zero * 16.0 + 8388608.0)[:, :, None]
    block_sum = tl.zeros(words.shape, dtype=tl.float32)
    for b in tl.static_range(4):
        t = words >> (8 * b)
        x_low = tl.load(x_block + (2 * b) * P).to(tl.float32)
        x_high = tl.load(x_block + (2 * b + 1) * P).to(tl.float32) * 0.0625
        low = _nibble_bits(t, False, ASM).to(tl.float32, bitcast=True)
        high = _nibble_bits(t, True, ASM).to(tl.float32, bitcast=True)
        block_sum += x_low[None, :, :] * (low - offset_low)
        block_sum += x_high[None, :, :] * (high - offset_high)
    return block_sum


@triton.jit
def _packed_block(words, x_block, zero, P: tl.constexpr, ASM: tl.constexpr):
    """One step's ``sum (q - zero) * x`` per word, two values an instruction in bfloat16
    pairs: plane ``j`` pairs with plane ``j + 4`` (bits ``4 j`` and ``4 j + 16``)."""
    pairs0 = _pair_bits(tl.load(x_block), tl.load(x_block + 4 * P), ASM)
    pairs1 = _pair_bits(tl.load(x_block + P), tl.load(x_block + 5 * P), ASM)
    pairs2 = _pair_bits(tl.load(x_block + 2 * P), tl.load(x_block + 6 * P), ASM)
    pairs3 = _pair_bits(tl.load(x_block + 3 * P), tl.load(x_block + 7 * P), ASM)
    return _word_dot(words, pairs0[None], pairs1[None], pairs2[None], pairs3[None], zero[:, :, None], ASM)


@triton.jit
def _step_weights(w_rows, s_ptr, z_ptr, rows, k0, K, splits, blocks_per_group, stride_sn, stride_zn, P: tl.constexpr):
    """One step's words ``[BLOCK_N, SPLIT, P]``, scales (float32, zero past K) and zero points
    ``[BLOCK_N, SPLIT]``, and its blocks' first inputs ``[SPLIT]``."""
    block_start = k0 + splits
    # Blocks past K read block 0 with a zero scale: no masked loads (nor their predicates) in the loop.
    valid = block_start < K
    block_start = tl.multiple_of(tl.where(valid, block_start, 0), P * 8)
    words = tl.load(w_rows + (block_start // 8)[None, :, None]).to(tl.uint32, bitcast=True)
    # blocks_per_group is 1 for groups of 128: Triton specializes the 1 and the division goes.
    group = (block_start // (P * 8) // blocks_per_group)[None, :]
    scale = tl.load(s_ptr + rows[:, None] * stride_sn + group).to(tl.float32)
    scale = tl.where(valid[None, :], scale, 0.0)
    zero = tl.load(z_ptr + rows[:, None] * stride_zn + group)
    return words, scale, zero, block_start


@triton.jit
def _step_sum(words, scale, zero, x_ptr, block_start, lanes, P: tl.constexpr, PACKED: tl.constexpr,
              ASM: tl.constexpr):
    """One step's scaled ``sum (q - zero) * x`` per word, ``[BLOCK_N, SPLIT, P]`` float32."""
    x_block = x_ptr + block_start[:, None] + lanes[None, :]
    if PACKED:
        return _packed_block(words, x_block, zero.to(tl.uint32), P, ASM) * scale[:, :, None]
    return _float_block(words, x_block, zero.to(tl.float32), P, ASM) * scale[:, :, None]


@triton.jit
def _int4_gemv_rows_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, b_ptr, out_ptr, N, K, blocks_per_group, stride_wn, stride_sn, stride_zn,
    BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, PACKED: tl.constexpr, ASM: tl.constexpr,
    PDL: tl.constexpr, PREFETCH: tl.constexpr = False, STAGES: tl.constexpr = 1,
):
    P: tl.constexpr = 16
    STEP: tl.constexpr = SPLIT * P * 8
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    # Out-of-range rows read row 0 instead of masking every load; 64-bit row offsets.
    rows = tl.where(mask_n, offs_n, 0).to(tl.int64)
    lanes = tl.arange(0, P)
    # A step takes SPLIT consecutive blocks. Shapes are [rows, blocks, lanes]: Triton lays threads
    # along the lanes, then the blocks, then the rows, so that a thread's rows share its activations.
    splits = tl.arange(0, SPLIT) * (P * 8)
    w_rows = w_ptr + rows[:, None, None] * stride_wn + lanes[None, None, :]
    acc = tl.zeros((BLOCK_N, SPLIT, P), dtype=tl.float32)
    if PREFETCH:
        # Loads are not software-pipelined without a dot: step k+1's weights are
        # issued before step k's arithmetic, twice the bytes in flight a thread
        # (the last step is the epilogue). The first step's go before the wait
        # for the kernel before (``pdl``): no kernel writes weights.
        words, scale, zero, block_start = _step_weights(w_rows, s_ptr, z_ptr, rows, 0, K, splits, blocks_per_group,
                                                        stride_sn, stride_zn, P)
        pdl_wait(PDL)
        for k0 in range(STEP, K, STEP):
            next_words, next_scale, next_zero, next_start = _step_weights(
                w_rows, s_ptr, z_ptr, rows, k0, K, splits, blocks_per_group, stride_sn, stride_zn, P)
            acc += _step_sum(words, scale, zero, x_ptr, block_start, lanes, P, PACKED, ASM)
            words, scale, zero, block_start = next_words, next_scale, next_zero, next_start
        acc += _step_sum(words, scale, zero, x_ptr, block_start, lanes, P, PACKED, ASM)
    else:
        pdl_wait(PDL)  # the activations come from the kernel before (octavo/kernels/pdl.py)
        # STAGES > 1: Triton pipelines every load of an annotated loop, dot or not (cp.async
        # into shared memory, STAGES - 1 steps ahead; sm_90 loop at (8, 8, 8): 5.2 instructions
        # a value against 3.9, two barriers a step); 1 leaves the loop as written.
        for k0 in tl.range(0, K, STEP, num_stages=STAGES):
            words, scale, zero, block_start = _step_weights(w_rows, s_ptr, z_ptr, rows, k0, K, splits,
                                                            blocks_per_group, stride_sn, stride_zn, P)
            acc += _step_sum(words, scale, zero, x_ptr, block_start, lanes, P, PACKED, ASM)
    pdl_release(PDL)
    out = tl.sum(tl.sum(acc, axis=2), axis=1)
    if HAS_BIAS:
        out += tl.load(b_ptr + rows).to(tl.float32)
    tl.store(out_ptr + offs_n, out.to(out_ptr.dtype.element_ty), mask=mask_n)


def takes(num_tokens: int, num_in: int, group_size: int, bits: int) -> bool:
    """Whether this kernel computes the call: one token, 4 bits, whole 128-input blocks per group."""
    return num_tokens == 1 and bits == 4 and num_in % 128 == 0 and group_size % 128 == 0


def int4_gemv_rows(x, qweight, scales, zeros, group_size: int, bias, tiles: RowsTiles | None = None) -> torch.Tensor:
    """``x @ W.T + bias`` for one token (``takes``) in Octavo's grouped int4 layout."""
    num_in, num_out = x.shape[1], qweight.shape[0]
    tiles = tiles or tiles_from_env() or TILES
    out = torch.empty(1, num_out, dtype=x.dtype, device=x.device)
    if num_out == 0:
        return out
    pdl = pdl_enabled(x.device, 1)
    asm = runs_ptx(x.device)
    # The pairs are bfloat16 (float16 sums of 16 (q - zero) x could overflow) and need the
    # PTX; the interpreter runs their plain-arithmetic twin, for the tests.
    packed = bool(tiles.packed) and x.dtype == torch.bfloat16 and (asm or interpreting())
    _int4_gemv_rows_kernel[(triton.cdiv(num_out, tiles.block_n),)](
        x, qweight, scales, zeros, bias if bias is not None else x, out, num_out, num_in, group_size // 128,
        qweight.stride(0), scales.stride(0), zeros.stride(0),
        BLOCK_N=tiles.block_n, SPLIT=tiles.split, HAS_BIAS=bias is not None, PACKED=packed, ASM=asm, PDL=pdl,
        PREFETCH=bool(tiles.prefetch), STAGES=tiles.stages, num_warps=tiles.num_warps, launch_pdl=pdl,
    )
    return out
