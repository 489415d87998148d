"""The one-token GGUF Q6_K GEMV in bfloat16 pairs (issue 17).

Q6_K is llama.cpp's Q4_K_M choice for half the layers' ``attn_v`` and
``ffn_down`` (and the LM head, which the GGUF loader dequantizes to the
model dtype). A row is 210-byte super-blocks of 256 values:
``ql`` (128 bytes of low nibbles), ``qh`` (64 bytes of 2-bit high parts),
sixteen int8 scales and float16 ``d`` at byte 208. Value ``128 h + l + 32 j``
(``h < 2``, ``l < 32``, ``j < 4``) is nibble ``j // 2`` of byte
``ql[64 h + 32 (j % 2) + l]`` with bits ``2 j`` of ``qh[32 h + l]`` above
it, less 32, times ``d sc[8 h + l // 16 + 2 j]``.

``gguf_triton``'s general one-token GEMV makes every value a float32 on its
own (13.7 sm_90 instructions a value in its loop at 8 rows a warp). Here a
lane is four consecutive ``l`` of one half ``h`` (``[BLOCK_N, SPLIT, 2, 8]``):
its two ``ql`` words and one ``qh`` word hold sixteen values in four groups of
four sharing a scale. Each group's bytes 0 and 2 (then 1 and 3) become the
bfloat16 pair ``128 + q`` with two ``lop3`` (the nibble with the exponent, then
the two high bits ORed in: 128 + 63 is exact in bfloat16), one ``fma`` takes
160 off (``q - 32``, exact), one multiplies by the activations' pair and
accumulates; the group's pair becomes float32 and takes ``d sc`` there, as
``gguf_q4k_pairs`` applies its scales.

A super-block is 210 bytes, so half of them start two bytes off a word: the
words are read as two 16-bit halves each and joined (``int4_gemv_rows``'s
``_pair_bits``). The interpreter runs a plain-arithmetic twin.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from octavo.env_switches import switch_from_env
from octavo.kernels.pdl import pdl_release, pdl_wait
from octavo.kernels.quant import bf16_pairs
from octavo.kernels.quant.bf16_pairs import PairsTiles, bf16_half, pairs_tiles_from_env
from octavo.kernels.quant.gguf_q4k_pairs import _halves
from octavo.kernels.quant.int4_gemv_rows import _pair_bits

SB_BYTES = 210  # one Q6_K super-block: 256 values
_SB_BYTES = tl.constexpr(SB_BYTES)
_SB_HALVES = tl.constexpr(SB_BYTES // 2)


# A first guess, as gguf_q4k_pairs' H200 winner (8, 4, 4): one row a thread
# (16 lanes a super-block, 8 rows x 4 super-blocks = 512 lanes for 128 threads).
TILES = PairsTiles(block_n=8, split=4, num_warps=4)


@functools.cache
def tiles_from_env() -> PairsTiles | None:
    """``OCTAVO_GGUF_Q6K_PAIRS_TILES=block_n,split,num_warps[,stages]`` (tuning runs), else None."""
    return pairs_tiles_from_env("OCTAVO_GGUF_Q6K_PAIRS_TILES")


@functools.cache
def pairs_enabled() -> bool:
    """``OCTAVO_GGUF_Q6K_PAIRS=1`` sends one-token Q6_K calls here. Off by default: on an H100
    (round 40, one 8B layer's four GEMVs in Q6_K, L2 flushed) 188-196 us against the general
    GEMV's 198 at its default tiles and 170 at its best; its sixteen-bit word loads (48 a loop
    step) cost what its 6.4 instructions a value save."""
    return switch_from_env("OCTAVO_GGUF_Q6K_PAIRS", default=False)


def _high_bits(qh: str, high_shift: int) -> tuple[str, ...]:
    """PTX: the two high bits at ``high_shift`` (and ``+ 16``) of ``qh`` moved to bits 4-5 of
    each half (a negative move is to the left) and ORed into ``t`` (``128 + nibble``)."""
    move = high_shift - 4
    if move > 0:
        line = f"shr.u32 h, {qh}, {move};"
    elif move < 0:
        line = f"shl.b32 h, {qh}, {-move};"
    else:
        line = f"mov.b32 h, {qh};"
    return line, "lop3.b32 t, t, h, 0x00300030, 0xF8;"  # t | (h & mask)


def _group_ptx(group: int) -> str:
    """Operands: $1 the ``ql`` word, $2 the ``qh`` word, $3 / $4 the activation pairs of
    bytes (0, 2) / (1, 3); $0 the float32 sum of the group's four ``(q - 32) x``."""
    nibble = 4 * (group // 2)
    return bf16_pairs.program(
        ".reg .b32 h, acc, m160;\nmov.b32 m160, 0xC320C320;",
        # Bytes 0 and 2, then 1 and 3: 128 + q with q - 32 taken off (m160), exact.
        bf16_pairs.pair_product("$1", nibble, "$3", "acc", "m160", first=True, high_bits=_high_bits("$2", 2 * group)),
        bf16_pairs.pair_product("$1", nibble + 8, "$4", "acc", "m160", high_bits=_high_bits("$2", 2 * group + 8)),
        bf16_pairs.halves_sum("acc", "$0"),
    )


_GROUP0 = tl.constexpr(_group_ptx(0))
_GROUP1 = tl.constexpr(_group_ptx(1))
_GROUP2 = tl.constexpr(_group_ptx(2))
_GROUP3 = tl.constexpr(_group_ptx(3))


@triton.jit
def _byte_value(ql, qh, byte: tl.constexpr, GROUP: tl.constexpr):
    """Plain twin: ``q - 32`` of byte ``byte`` of a lane's group ``GROUP``, float32."""
    nibble = (ql >> (8 * byte + 4 * (GROUP // 2))) & 15
    high = (qh >> (8 * byte + 2 * GROUP)) & 3
    return (nibble | (high << 4)).to(tl.float32) - 32.0


@triton.jit
def _group_sum(ql, qh, p02, p13, GROUP: tl.constexpr, ASM: tl.constexpr):
    """float32 ``sum (q - 32) x`` over the four values of group ``GROUP`` of each lane."""
    if ASM:
        if GROUP == 0:
            asm: tl.constexpr = _GROUP0
        elif GROUP == 1:
            asm: tl.constexpr = _GROUP1
        elif GROUP == 2:
            asm: tl.constexpr = _GROUP2
        else:
            asm: tl.constexpr = _GROUP3
        return tl.inline_asm_elementwise(asm, "=f,r,r,r,r", [ql, qh, p02, p13], dtype=tl.float32, is_pure=True,
                                         pack=1)
    return (_byte_value(ql, qh, 0, GROUP) * bf16_half(p02, False) + _byte_value(ql, qh, 2, GROUP) * bf16_half(p02, True)
            + _byte_value(ql, qh, 1, GROUP) * bf16_half(p13, False)
            + _byte_value(ql, qh, 3, GROUP) * bf16_half(p13, True))


@triton.jit
def _word(halves, offset, ASM: tl.constexpr):
    """The 32-bit word at 16-bit ``offset`` (two loads: a super-block may start off a word)."""
    return _pair_bits(tl.load(halves + offset), tl.load(halves + offset + 1), ASM)


@triton.jit
def _scale(halves, h, g, GROUP: tl.constexpr):
    """float32 ``sc[8 h + g // 4 + 2 GROUP]`` (int8) per lane."""
    pair = tl.load(halves + 96 + 4 * h + GROUP).to(tl.uint32)
    return ((pair >> (8 * (g // 4))) & 0xFF).to(tl.uint8).to(tl.int8, bitcast=True).to(tl.float32)


@triton.jit
def _x_pairs(x_quads, GROUP: tl.constexpr, ASM: tl.constexpr):
    """A group's four activations (one 64-bit load) as the pairs of values (0, 2) and (1, 3)."""
    quad = tl.load(x_quads + 8 * GROUP)
    x01 = quad.to(tl.uint32)
    x23 = (quad >> 32).to(tl.uint32)
    return _halves(x01, x23, 0, ASM), _halves(x01, x23, 1, ASM)


@triton.jit
def _super_block_sums(halves, x_quads, h, g, ASM: tl.constexpr):
    """Each lane's ``sum sc (q - 32) x`` over its sixteen values, float32 (``d`` not applied)."""
    ql_a = _word(halves, 32 * h + 2 * g, ASM)  # groups 0 and 2
    ql_b = _word(halves, 32 * h + 16 + 2 * g, ASM)  # groups 1 and 3
    qh = _word(halves, 64 + 16 * h + 2 * g, ASM)
    total = tl.zeros(ql_a.shape, dtype=tl.float32)
    for group in tl.static_range(4):
        p02, p13 = _x_pairs(x_quads, group, ASM)
        ql = ql_a if group % 2 == 0 else ql_b
        total += _scale(halves, h, g, group) * _group_sum(ql, qh, p02[None], p13[None], group, ASM)
    return total


@triton.jit
def _q6k_pairs_kernel(
    x_ptr, w_ptr, out_ptr, N, K, row_bytes,
    BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, ASM: tl.constexpr, PDL: tl.constexpr, STAGES: tl.constexpr = 1,
):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    rows = w_ptr + tl.where(mask_n, offs_n, 0).to(tl.int64) * row_bytes  # [BLOCK_N] byte pointers
    h = tl.arange(0, 2)[None, :, None]  # [1, 2, 1]: a super-block's 128-value halves
    g = tl.arange(0, 8)[None, None, :]  # [1, 1, 8]: four l a lane
    steps = tl.arange(0, SPLIT)
    x_quads = x_ptr.to(tl.pointer_type(tl.uint64))  # the activations four at a time
    num_sb = K // 256
    acc = tl.zeros((BLOCK_N, SPLIT, 2, 8), dtype=tl.float32)
    pdl_wait(PDL)  # the activations come from the kernel before (octavo/kernels/pdl.py)
    # STAGES > 1: every load of the loop pipelined through shared memory (as int4_gemv_rows).
    for sb0 in tl.range(0, num_sb, SPLIT, num_stages=STAGES):
        # Super-blocks past the row's end read super-block 0 with d = 0.
        live = sb0 + steps < num_sb
        sb = tl.where(live, sb0 + steps, 0)
        sb_bytes = rows[:, None] + (sb * _SB_BYTES)[None, :]  # [BLOCK_N, SPLIT]
        halves = sb_bytes.to(tl.pointer_type(tl.uint16))[:, :, None, None]
        d = tl.load(halves + (_SB_HALVES - 1)).to(tl.float16, bitcast=True).to(tl.float32)
        d = tl.where(live[None, :, None, None], d, 0.0)
        # Value 256 sb + 128 h + 4 g + 32 j + {0..3}: quad 64 sb + 32 h + g + 8 j.
        x_lane = x_quads + (64 * sb)[:, None, None] + 32 * h + g  # [SPLIT, 2, 8]
        acc += d * _super_block_sums(halves, x_lane, h[None], g[None], ASM)
    pdl_release(PDL)
    out = tl.sum(tl.sum(tl.sum(acc, axis=3), axis=2), axis=1)
    tl.store(out_ptr + offs_n, out.to(out_ptr.dtype.element_ty), mask=mask_n)


def takes(x: torch.Tensor, raw: torch.Tensor, type_name: str) -> bool:
    """One bfloat16 token of a Q6_K weight, where the pairs' PTX runs (16-bit weight loads: a super-block may start off a word)."""
    return type_name == "Q6_K" and bf16_pairs.takes_token(x, raw, 2) and pairs_enabled()


def q6k_gemv_pairs(x: torch.Tensor, raw: torch.Tensor, tiles: PairsTiles | None = None) -> torch.Tensor:
    """``x @ W.T`` for one token (``takes``) and raw Q6_K rows ``[N, row_bytes]``."""
    return bf16_pairs.launch_gemv(_q6k_pairs_kernel, x, raw, SB_BYTES, tiles or tiles_from_env() or TILES)
