"""The int4 tensor-core kernel's weight tile made in bfloat16 pairs (issue 17).

``int4_word_tile.word_major_tile`` makes each value in float32 (a shift,
an AND-OR, an FMA) and packs two into bfloat16 for the tensor cores: its
sm_90 loop spends ~4.5 instructions a weight value on it, more than the
one-token GEMV's whole 3.9. Here one ``lop3`` makes two values of a word as the bfloat16 pair
``(128 + q, 128 + q')`` (``bf16_pairs``: planes ``j`` and ``j + 4``, bits
``4 j`` and ``4 j + 16``), one ``fma`` with 1 takes ``128 + zero`` off (exact:
small integers) and one more multiplies by the scale pair: two values in
three or four instructions, already packed for the shared-memory store.
``(q - zero) * scale`` is rounded once, as the float32 tile rounds it when
it packs: the same bfloat16 weights, bit for bit, for bfloat16 scales.

The tile's order along K is pair-major: within a 128-input layout block,
word ``p``'s plane pair ``j`` (inputs ``p + 16 j`` and ``p + 16 j + 64``) is at
``8 p + 2 j`` and ``8 p + 2 j + 1``; ``pair_major`` orders the activations so
(the sum over K does not care about its order). Groups of 128 or more
inputs only (one scale and zero a row and block), 4 bits, bfloat16.

Loops of 3.0-4.9 instructions a value against 6.0-6.9 (sm_90), yet on an
H100 (round 41) slower than the float32 tile at 1-64 tokens and 3% faster
at 256: opt-in (``GroupedMmConfig.pairs``), for the sweeps to rank.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo.kernels.quant.bf16_pairs import bf16_half


def word_asm() -> str:
    """PTX: the eight bfloat16 values of word ``$8``, planes 0-3 in ``$0``-``$3`` and 4-7 in
    ``$4``-``$7``: ``((128 + q) + $9) * $10`` each, ``$9`` the pair ``-(128 + zero)``, ``$10``
    the scale pair (the ``fma`` adds -0, the sum's identity: one rounding)."""
    lines = [".reg .b32 q, t, one, nz;", "mov.b32 one, 0x3F803F80;", "mov.b32 nz, 0x80008000;"]
    for j in range(4):
        source = "q" if j else "$8"
        if j:
            lines.append(f"shr.u32 q, $8, {4 * j};")
        lines += [
            f"lop3.b32 t, {source}, 0x000F000F, 0x43004300, 0xEA;",
            "fma.rn.bf16x2 t, t, one, $9;",
            "fma.rn.bf16x2 t, t, $10, nz;",
            f"mov.b32 {{${j}, ${j + 4}}}, t;",
        ]
    return "{\n" + "\n".join(lines) + "\n}"


# One statement a word (ptxas makes the same loop of it as of four, one a plane pair).
WORD_ASM = tl.constexpr(word_asm())


@triton.jit
def group_pairs(s_ptr, z_ptr, rows, stride_sn, stride_zn, first, group_size):
    """The pairs ``-(128 + zero)`` and ``(scale, scale)`` (uint32 ``[BLOCK_N, BLOCKS, 1]``) of the
    groups holding inputs ``first`` ``[BLOCKS]`` of ``rows``; scales in bfloat16."""
    group = (first // group_size)[None, :]
    scale = tl.load(s_ptr + rows[:, None] * stride_sn + group).to(tl.uint16, bitcast=True).to(tl.uint32)
    zero = tl.load(z_ptr + rows[:, None] * stride_zn + group).to(tl.uint32)
    return (zero | (zero << 16) | 0xC300C300)[:, :, None], (scale | (scale << 16))[:, :, None]


@triton.jit
def _plane_pair(words, J: tl.constexpr, offset, scale):
    """Plain twin of planes ``J`` and ``J + 4`` (the interpreter): exact to the subtraction, one
    rounding after the product."""
    low = ((words >> (4 * J)) & 15).to(tl.float32) + 128.0 + bf16_half(offset, False)
    high = ((words >> (4 * J + 16)) & 15).to(tl.float32) + 128.0 + bf16_half(offset, False)
    s = bf16_half(scale, False)
    return (low * s).to(tl.bfloat16), (high * s).to(tl.bfloat16)


@triton.jit
def pair_major_tile(w_ptr, rows, stride_wn, k0, offset, scale, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    ASM: tl.constexpr):
    """Inputs ``k0 .. k0 + BLOCK_K`` of weight rows ``rows`` in pair-major order:
    bfloat16 ``[BLOCK_N, BLOCK_K]``; ``offset``, ``scale``: ``group_pairs`` of its blocks."""
    BLOCKS: tl.constexpr = BLOCK_K // 128
    words = tl.load(w_ptr + rows[:, None, None] * stride_wn + (k0 // 8 + tl.arange(0, BLOCKS) * 16)[None, :, None]
                    + tl.arange(0, 16)[None, None, :]).to(tl.uint32, bitcast=True)
    if ASM:
        lo0, lo1, lo2, lo3, hi0, hi1, hi2, hi3 = tl.inline_asm_elementwise(
            WORD_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r", [words, offset, scale], dtype=(tl.bfloat16,) * 8,
            is_pure=True, pack=1)
    else:
        lo0, hi0 = _plane_pair(words, 0, offset, scale)
        lo1, hi1 = _plane_pair(words, 1, offset, scale)
        lo2, hi2 = _plane_pair(words, 2, offset, scale)
        lo3, hi3 = _plane_pair(words, 3, offset, scale)
    # Nested joins: plane pair j at 2 j, its high half next to it (a thread's values stay in their words).
    low = tl.join(tl.join(lo0, lo2), tl.join(lo1, lo3))
    high = tl.join(tl.join(hi0, hi2), tl.join(hi1, hi3))
    return tl.reshape(tl.join(low, high), (BLOCK_N, BLOCK_K))


def pair_major(x: torch.Tensor) -> torch.Tensor:
    """The activations in ``pair_major_tile``'s order: within each 128-input block, input
    ``p + 16 j + 64 h`` (word ``p``, plane pair ``j``, half ``h``) at ``8 p + 2 j + h``."""
    num_tokens, num_in = x.shape
    blocks = x.reshape(num_tokens, num_in // 128, 2, 4, 16)
    return blocks.permute(0, 1, 4, 3, 2).contiguous().reshape(num_tokens, num_in)


def takes_pairs(x: torch.Tensor, scales: torch.Tensor, bits: int, group_size: int) -> bool:
    """Whether the pair tile can stand for the float32 one: bfloat16 activations and scales,
    4 bits, groups of whole 128-input blocks."""
    return (x.dtype == torch.bfloat16 and scales.dtype == torch.bfloat16 and bits == 4
            and group_size % 128 == 0 and x.shape[1] % 128 == 0)
