"""The one-token int4 GEMV on 8-bit dot products (``dp4a``): weights int4,
activations int8 per block of 128 (W4A8, opt-in; issue 17).

``int4_gemv_rows`` turns every weight into a 16-bit value before its product:
3.9 sm_90 instructions a weight value, which round 41 read as the limit of
the one-token int4 GEMV (issue-bound). This kernel tests that reading with
2.6x fewer instructions a value; on an H100 (round 42 of
``benchmarks/RESULTS.md``) it runs an 8B layer in the same time as the rows
GEMV (60.7 against 60.9 us), faster on gate_up only: the rows GEMV is not
issue-bound there.

Here the weights stay integers. The token's activations are first quantized,
one launch, to int8 per block of 128 inputs (``int8_activations``: the
block's absolute maximum maps to 127, round half up; the block's scale and
its values' sum kept), and packed four to a word in the order of Octavo's
``int4`` layout: word ``i`` of a block holds inputs ``i + 16 j`` in its
nibble ``j``, so ``w & 0x0F0F0F0F`` is the four inputs ``i, i + 32, i + 64,
i + 96`` as unsigned bytes and ``(w >> 4) & 0x0F0F0F0F`` the four ``16``
further on; the activations' words ``A_i`` and ``B_i`` hold the same inputs'
int8 values. Two ``dp4a`` make a word's eight products, exact in int32: one
``and``, a shift, one more ``and`` and the two dot products, five
instructions for eight values (``_WORD_DOT_ASM``). A block's sum ``sum q
x8`` less ``zero * sum x8`` (the zero point, exact) times the weights' group
scale and the activations' block scale is the block's float32 term.

What changes against the bfloat16 reference: each activation is rounded to
its block's int8 grid (half a step, ``amax / 254``, at most), the error of
llama.cpp's 8-bit decode products (per 32 there) and smaller than the fp8
W8A8 path's e4m3 rounding. ``OCTAVO_INT4_GEMV_DP4A=1`` takes it; the default
stays the bfloat16 form: as fast on the H100, and exact.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from octavo.env_switches import switch_from_env
from octavo.kernels.pdl import pdl_enabled, pdl_release, pdl_wait
from octavo.kernels.quant import int8_activations
from octavo.kernels.quant.int8_activations import INT4_ORDER
from octavo.kernels.triton_utils import interpreting, ints_from_env, runs_ptx

BLOCK = 128  # inputs a block: the weights' packing unit and the activations' scale


@dataclass(frozen=True)
class Dp4aTiles:
    """Tiles of a one-token dp4a GEMV (this one's and ``gguf_q4k_dp4a``'s)."""

    block_n: int  # rows a program
    split: int  # blocks a step: 128 inputs here, Q4_K super-blocks of 256 there
    num_warps: int


def dp4a_tiles_from_env(name: str) -> Dp4aTiles | None:
    """``name=block_n,split,num_warps`` (tuning runs), else None."""
    parts = ints_from_env(name, "block_n,split,num_warps", (3,))
    return None if parts is None else Dp4aTiles(*parts)


# sm_90 SASS (tests/kernels/sass_loops.py): 1.5 instructions a weight value at (8, 16, 8) and
# (4, 16, 4), barrier-free (16 rows: 1.15, with a trip through shared memory). Swept on an H100
# (round 42, one 8B layer's four GEMVs with the activations' launch): 84.4 us at (4, 16, 4),
# 83.6 at (2, 16, 4), 90.2 at (8, 16, 8); the rows GEMV's best 82.9 in the same run.
TILES = Dp4aTiles(block_n=4, split=16, num_warps=4)


@functools.cache
def tiles_from_env() -> Dp4aTiles | None:
    """``OCTAVO_INT4_DP4A_TILES=block_n,split,num_warps`` (tuning runs), else None."""
    return dp4a_tiles_from_env("OCTAVO_INT4_DP4A_TILES")


@functools.cache
def dp4a_enabled() -> bool:
    """``OCTAVO_INT4_GEMV_DP4A=1`` sends one-token int4 calls here (W4A8); off by default."""
    return switch_from_env("OCTAVO_INT4_GEMV_DP4A", default=False)


# One word's eight products: $1 the weights' word, $2 and $3 the activations' A and B words.
_WORD_DOT_ASM = tl.constexpr("""{
.reg .b32 lo, hi, t;
and.b32 lo, $1, 0x0F0F0F0F;
shr.u32 hi, $1, 4;
and.b32 hi, hi, 0x0F0F0F0F;
dp4a.u32.s32 t, lo, $2, 0;
dp4a.u32.s32 $0, hi, $3, t;
}""")


@triton.jit
def _dp4a_twin(unsigned_bytes, signed_bytes):
    """Plain-arithmetic ``dp4a.u32.s32`` (accumulator 0): four unsigned by four signed bytes."""
    total = tl.zeros(unsigned_bytes.shape, dtype=tl.int32)
    for lane in tl.static_range(4):
        a = ((unsigned_bytes >> (8 * lane)) & 0xFF).to(tl.int32)  # uint32 words: products signed
        b = (signed_bytes << (24 - 8 * lane)) >> 24  # int32: the shift back sign-extends
        total += a * b
    return total


@triton.jit
def _word_dots(words, a_words, b_words, ASM: tl.constexpr):
    """``sum_j q_j x8_j`` over each int32 word's eight nibbles, int32."""
    if ASM:
        return tl.inline_asm_elementwise(_WORD_DOT_ASM, "=r,r,r,r", [words, a_words, b_words], dtype=tl.int32,
                                         is_pure=True, pack=1)
    return _dp4a_twin(words & 0x0F0F0F0F, a_words) + _dp4a_twin((words >> 4) & 0x0F0F0F0F, b_words)


@triton.jit
def _int4_gemv_dp4a_kernel(
    q_ptr, xs_ptr, xsum_ptr, w_ptr, s_ptr, z_ptr, b_ptr, out_ptr, N, num_blocks, blocks_per_group,
    stride_wn, stride_sn, stride_zn,
    BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, ASM: tl.constexpr, PDL: tl.constexpr,
    EVEN: tl.constexpr = False,
):
    WORDS: tl.constexpr = 16
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    # Out-of-range rows read row 0 instead of masking every load; 64-bit row offsets.
    rows = tl.where(mask_n, offs_n, 0).to(tl.int64)
    lanes = tl.arange(0, WORDS)
    w_rows = w_ptr + rows[:, None, None] * stride_wn + lanes[None, None, :]
    acc = tl.zeros((BLOCK_N, SPLIT), dtype=tl.float32)
    pdl_wait(PDL)  # the activations' words come from int8_activations.quantize, the kernel before
    for first in range(0, num_blocks, SPLIT):
        blocks = first + tl.arange(0, SPLIT)
        # Blocks past K read block 0 with a zero scale: no masked loads in the loop.
        valid = blocks < num_blocks
        if not EVEN:
            blocks = tl.where(valid, blocks, 0)
        words = tl.load(w_rows + (blocks * WORDS)[None, :, None])
        # The activations' words through pointers of the weights' shape: loaded in their layout
        # (a [SPLIT, 16] load takes its own and goes through shared memory to meet them).
        x_words = tl.broadcast_to(q_ptr + (blocks * (2 * WORDS))[None, :, None] + lanes[None, None, :],
                                  (BLOCK_N, SPLIT, WORDS))
        a_words = tl.load(x_words)
        b_words = tl.load(x_words + WORDS)
        dots = tl.sum(_word_dots(words, a_words, b_words, ASM), axis=2)
        group = (blocks // blocks_per_group)[None, :]
        scale = tl.load(s_ptr + rows[:, None] * stride_sn + group).to(tl.float32)
        zero = tl.load(z_ptr + rows[:, None] * stride_zn + group).to(tl.int32)
        x_scale = tl.load(xs_ptr + blocks)
        if not EVEN:
            x_scale = tl.where(valid, x_scale, 0.0)
        x_sum = tl.load(xsum_ptr + blocks)
        acc += (scale * x_scale[None, :]) * (dots - zero * x_sum[None, :]).to(tl.float32)
    pdl_release(PDL)
    out = tl.sum(acc, axis=1)
    if HAS_BIAS:
        out += tl.load(b_ptr + rows).to(tl.float32)
    tl.store(out_ptr + offs_n, out.to(out_ptr.dtype.element_ty), mask=mask_n)


def takes(x: torch.Tensor, group_size: int, bits: int) -> bool:
    """Whether this path computes ``x @ W.T``: switched on, one token, 4 bits, whole 128-input
    blocks per group, where the PTX runs (the interpreter runs the twin)."""
    return (dp4a_enabled() and x.shape[0] == 1 and bits == 4 and x.shape[1] % BLOCK == 0 and group_size % BLOCK == 0
            and (runs_ptx(x.device) or interpreting()))


def int4_gemv_dp4a(x, qweight, scales, zeros, group_size: int, bias, tiles: Dp4aTiles | None = None) -> torch.Tensor:
    """``x @ W.T + bias`` for one token in Octavo's grouped int4 layout, activations in int8
    per block of 128 (two launches: ``int8_activations.quantize``, then the GEMV)."""
    num_out = qweight.shape[0]
    tiles = tiles or tiles_from_env() or TILES
    out = torch.empty(1, num_out, dtype=x.dtype, device=x.device)
    if num_out == 0:
        return out
    x_words, x_scales, x_sums = int8_activations.quantize(x, INT4_ORDER)
    num_blocks = x_scales.shape[0]
    pdl = pdl_enabled(x.device, 1)
    _int4_gemv_dp4a_kernel[(triton.cdiv(num_out, tiles.block_n),)](
        x_words, x_scales, x_sums, qweight, scales, zeros, bias if bias is not None else x, out, num_out,
        num_blocks, group_size // BLOCK, qweight.stride(0), scales.stride(0), zeros.stride(0),
        BLOCK_N=tiles.block_n, SPLIT=tiles.split, HAS_BIAS=bias is not None, ASM=runs_ptx(x.device), PDL=pdl,
        EVEN=num_blocks % tiles.split == 0, num_warps=tiles.num_warps, launch_pdl=pdl,
    )
    return out
