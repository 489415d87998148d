"""The one-token GGUF Q4_K GEMV in bfloat16 pairs (issue 17).

Q4_K keeps a row as 144-byte super-blocks of 256 values: float16 ``d`` and
``dmin``, twelve bytes of 6-bit (scale, min) for eight 32-value sub-blocks,
then 128 bytes of nibbles in four 64-value chunks (byte ``l`` of chunk ``a``:
value ``64 a + l`` in its low nibble, ``64 a + 32 + l`` in its high one;
sub-blocks ``2 a`` and ``2 a + 1``). A value is ``d sc q - dmin mn``.

``gguf_triton``'s general GEMV makes each value a float32 on its own: 9.3
sm_90 instructions a value in its one-token loop (``tests/kernels/
sass_loops.py``). Here the 32-bit words of a super-block's nibbles are the
lanes (``[BLOCK_N, SPLIT, 4 chunks, 8 words]``) and each word's eight values
go in bfloat16 pairs (``_WORD_ASM``, ``bf16_pairs``): ``lop3`` makes the pair
of bytes 0 and 2 (or 1 and 3; low or high nibbles) as ``128 + q``, one
``fma`` takes the 128 off (exact), one multiplies by the activations' pair
and accumulates; a word gives two float32 sums of ``q x``, over its low
nibbles (sub-block ``2 a``) and its high ones (``2 a + 1``). The scales and
mins are applied in float32, ``d sc * sum(q x) - dmin mn * sum(x)``: folding
them into bfloat16 weights first (``q s - m`` in one ``fma``) rounded ``s``
and ``m`` once per sub-block, an error shared by its 32 values, 4-7 times
the dense path's (checked under the interpreter). A word's four activations
are one 64-bit load; their pairs ``(x_l, x_l+2)`` a ``prmt`` each and their
sum one bfloat16 pair add then float32, shared by a thread's rows. The 6-bit
scales are decoded from the super-block header's words at the words' shape
(decoded at the chunks' own shape they changed layout through shared memory
every step). The interpreter runs a plain-arithmetic twin of the same steps.
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

SB_BYTES = 144  # one Q4_K super-block: 256 values
_SB_BYTES = tl.constexpr(SB_BYTES)


# Swept on the H200 (round 35, one 8B layer's four GEMVs of Q4_K, L2 flushed,
# graphs): 96.9 us at (8, 4, 4), 110.4 at (8, 2, 4), 149.9 at the first guess
# (32, 1, 4), whose two rows a thread made fewer loads in flight.
TILES = PairsTiles(block_n=8, split=4, num_warps=4)


@functools.cache
def tiles_from_env() -> PairsTiles | None:
    """``OCTAVO_GGUF_Q4K_PAIRS_TILES=block_n,split,num_warps[,stages]`` (tuning runs), else None."""
    return pairs_tiles_from_env("OCTAVO_GGUF_Q4K_PAIRS_TILES")


@functools.cache
def pairs_enabled() -> bool:
    """``OCTAVO_GGUF_Q4K_PAIRS=0`` sends one-token Q4_K calls to the general GEMV (A/B runs)."""
    return switch_from_env("OCTAVO_GGUF_Q4K_PAIRS")


# $2 the word; $3-$6 activation pairs for (bytes 0, 2 low), (1, 3 low), (0, 2 high),
# (1, 3 high). $0 / $1: the sums of q x over the low / high nibbles (q exact in bfloat16,
# four products a lane rounded to bfloat16, the halves added in float32).
_WORD_ASM = tl.constexpr(bf16_pairs.program(
    ".reg .b32 m128, lo2, hi2;\nmov.b32 m128, 0xC300C300;",
    bf16_pairs.pair_product("$2", 0, "$3", "lo2", "m128", first=True),
    bf16_pairs.pair_product("$2", 8, "$4", "lo2", "m128"),
    bf16_pairs.pair_product("$2", 4, "$5", "hi2", "m128", first=True),
    bf16_pairs.pair_product("$2", 12, "$6", "hi2", "m128"),
    bf16_pairs.halves_sum("lo2", "$0"),
    bf16_pairs.halves_sum("hi2", "$1"),
))


@triton.jit
def _halves(a, b, SELECT: tl.constexpr, ASM: tl.constexpr):
    """The pair of ``a``'s and ``b``'s low halves (``SELECT`` 0) or high halves (1)."""
    if ASM:
        if SELECT == 0:
            return tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, 0x5410;", "=r,r,r", [a, b], dtype=tl.uint32,
                                             is_pure=True, pack=1)
        return tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, 0x7632;", "=r,r,r", [a, b], dtype=tl.uint32,
                                         is_pure=True, pack=1)
    if SELECT == 0:
        return (a & 0xFFFF) | (b << 16)
    return (a >> 16) | (b & 0xFFFF0000)

# $0 = the sum of the four bfloat16 values in the pairs $1 and $2.
_PAIR_SUM_ASM = tl.constexpr(bf16_pairs.program(
    ".reg .b32 s;", "fma.rn.bf16x2 s, $1, one, $2;", bf16_pairs.halves_sum("s", "$0")))


@triton.jit
def _pair_dot(t, x_pair):
    """Twin of one pair's step of ``_WORD_ASM`` in float32: nibbles at bits 0 and 16 of ``t``."""
    return (t & 15).to(tl.float32) * bf16_half(x_pair, False) + ((t >> 16) & 15).to(tl.float32) * bf16_half(x_pair, True)


@triton.jit
def _word_sums(words, p02, p13, q02, q13, ASM: tl.constexpr):
    """Each word's ``sum q x`` over its low nibbles and over its high nibbles, float32."""
    if ASM:
        return tl.inline_asm_elementwise(_WORD_ASM, "=f,=f,r,r,r,r,r", [words, p02, p13, q02, q13],
                                         dtype=(tl.float32, tl.float32), is_pure=True, pack=1)
    return _pair_dot(words, p02) + _pair_dot(words >> 8, p13), _pair_dot(words >> 4, q02) + _pair_dot(words >> 12, q13)


@triton.jit
def _pair_sum(a, b, ASM: tl.constexpr):
    """float32 sum of the four bfloat16 values in two pairs: one bfloat16 pair add (a
    rounding per two activations, as a dequantized bfloat16 weight has per value),
    then the halves in float32."""
    if ASM:
        return tl.inline_asm_elementwise(_PAIR_SUM_ASM, "=f,r,r", [a, b], dtype=tl.float32, is_pure=True, pack=1)
    return (bf16_half(a, False) + bf16_half(a, True)) + (bf16_half(b, False) + bf16_half(b, True))


@triton.jit
def _small_float(q):
    """float32 of a uint32 in ``[0, 2**23)``: the exponent ORed in, ``2**23`` taken off."""
    return (q | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _chunk_scales(sb_words, live, chunk):
    """Per chunk (``[BLOCK_N, SPLIT, 4, 1]``): float32 scales and mins (``d sc``, ``dmin mn``)
    of its two sub-blocks, zero where the super-block is not ``live``. The header is
    read as four words ``[BLOCK_N, SPLIT, 1, 1]`` and decoded at the words' shape
    (chunk index broadcast), so that no value changes layout in the loop.

    ggml's ``get_scale_min_k4`` for sub-blocks ``2 a`` and ``2 a + 1`` at once, the two
    6-bit values in the two low bytes of one word: bytes ``2 a, 2 a + 1`` of the scale
    words (``a < 2``: ``scale & 63``, ``min & 63``) or bytes ``2 a - 4, 2 a - 3`` (``a >= 2``:
    four bits from the third word, two from the top of the first or second)."""
    dd = tl.load(sb_words)  # d, dmin: two float16
    d = tl.where(live, (dd & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32), 0.0)
    dmin = tl.where(live, (dd >> 16).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32), 0.0)
    shift = 16 * (chunk & 1)
    ta = tl.load(sb_words + 1) >> shift
    tb = tl.load(sb_words + 2) >> shift
    tc = tl.load(sb_words + 3) >> shift
    high = chunk >= 2
    scales = tl.where(high, (tc & 0x0F0F) | ((ta >> 2) & 0x3030), ta & 0x3F3F)
    mins = tl.where(high, ((tc >> 4) & 0x0F0F) | ((tb >> 2) & 0x3030), tb & 0x3F3F)
    return (d * _small_float(scales & 0xFF), dmin * _small_float(mins & 0xFF), d * _small_float(scales >> 8),
            dmin * _small_float(mins >> 8))


@triton.jit
def _q4k_pairs_kernel(
    x_ptr, w_ptr, out_ptr, N, K, row_bytes,
    BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, ASM: tl.constexpr, PDL: tl.constexpr, STAGES: tl.constexpr = 1,
):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    rows = w_ptr + tl.where(mask_n, offs_n, 0).to(tl.int64) * row_bytes  # [BLOCK_N] byte pointers
    chunk = tl.arange(0, 4)[None, :, None]  # [1, 4, 1]: a super-block's 64-value chunks
    word = tl.arange(0, 8)[None, None, :]  # [1, 1, 8]: a chunk's 32 bytes as words
    steps = tl.arange(0, SPLIT)
    x_quads = x_ptr.to(tl.pointer_type(tl.uint64))  # the activations four at a time
    num_sb = K // 256
    acc = tl.zeros((BLOCK_N, SPLIT, 4, 8), dtype=tl.float32)
    pdl_wait(PDL)  # the activations come from the kernel before (octavo/kernels/pdl.py)
    # STAGES > 1: every load of the loop pipelined through shared memory (as int4_gemv_rows).
    for sb0 in tl.range(0, num_sb, SPLIT, num_stages=STAGES):
        # Super-blocks past the row's end read super-block 0 with zero scales.
        live = sb0 + steps < num_sb
        sb = tl.where(live, sb0 + steps, 0)
        sb_ptr = rows[:, None] + (sb * _SB_BYTES)[None, :]  # [BLOCK_N, SPLIT]
        # As 32-bit words (offsets in words, so that Triton sees four a thread contiguous: one vector load).
        sb_words = sb_ptr.to(tl.pointer_type(tl.uint32))[:, :, None, None]
        s_lo, m_lo, s_hi, m_hi = _chunk_scales(sb_words, live[None, :, None, None], chunk[None])
        words = tl.load(sb_words + 4 + 8 * chunk[None] + word[None])
        # Values 64 a + 4 i + {0..3} (low nibbles) and + 32 (high): pairs (x0, x2), (x1, x3).
        # Four activations a word as one 64-bit load, low nibbles' then high nibbles'.
        x_low = x_quads + (64 * sb)[:, None, None] + 16 * chunk + word  # [SPLIT, 4, 8]
        x0123 = tl.load(x_low)
        y0123 = tl.load(x_low + 8)
        x01 = x0123.to(tl.uint32)
        x23 = (x0123 >> 32).to(tl.uint32)
        y01 = y0123.to(tl.uint32)
        y23 = (y0123 >> 32).to(tl.uint32)
        # The mins multiply each sub-block's activation sum (shared by the rows).
        x_sum_lo = _pair_sum(x01, x23, ASM)[None]
        x_sum_hi = _pair_sum(y01, y23, ASM)[None]
        sum_lo, sum_hi = _word_sums(words, _halves(x01, x23, 0, ASM)[None], _halves(x01, x23, 1, ASM)[None],
                                    _halves(y01, y23, 0, ASM)[None], _halves(y01, y23, 1, ASM)[None], ASM)
        acc += s_lo * sum_lo + s_hi * sum_hi - m_lo * x_sum_lo - m_hi * x_sum_hi
    pdl_release(PDL)
    out = tl.sum(tl.sum(tl.sum(acc, axis=3), axis=2), axis=1)
    tl.store(out_ptr + offs_n, out.to(out_ptr.dtype.element_ty), mask=mask_n)


def takes(x: torch.Tensor, raw: torch.Tensor, type_name: str) -> bool:
    """One bfloat16 token of a Q4_K weight, where the pairs' PTX runs (32-bit weight loads)."""
    return type_name == "Q4_K" and bf16_pairs.takes_token(x, raw, 4) and pairs_enabled()


def q4k_gemv_pairs(x: torch.Tensor, raw: torch.Tensor, tiles: PairsTiles | None = None) -> torch.Tensor:
    """``x @ W.T`` for one token (``takes``) and raw Q4_K rows ``[N, row_bytes]``."""
    return bf16_pairs.launch_gemv(_q4k_pairs_kernel, x, raw, SB_BYTES, tiles or tiles_from_env() or TILES)
