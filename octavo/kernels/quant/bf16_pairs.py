"""PTX for 4-bit values multiplied in bfloat16 pairs (sm_80+), shared by the
one-token int4 and Q4_K GEMVs (``int4_gemv_rows``, ``gguf_q4k_pairs``).

``lop3`` with the mask ``0x000F000F`` and the exponent pair ``0x43004300``
turns the nibbles at bits ``s`` and ``s + 16`` of a word (shifted down by
``s``) into the bfloat16 pair ``(128 + q_lo, 128 + q_hi)``: bfloat16's 128 has
seven mantissa bits of weight 1, so a nibble ORed into the low ones is exact.
One ``fma`` with 1 takes an offset pair off (``-(128 + zero)``: exact, small
integers), one more multiplies by the activations' pair and accumulates. A
pair accumulator becomes float32 by shifting its halves into place (a
bfloat16 is a float32's top half) and adding them; ``bf16_half`` does the same
in Triton, for the kernels' plain twins and for activations read as words.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl

from octavo.kernels.triton_utils import ints_from_env

@dataclass(frozen=True)
class PairsTiles:
    """Tiles of a one-token GGUF GEMV over super-blocks in pairs (``gguf_q4k_pairs``, ``gguf_q6k_pairs``)."""

    block_n: int  # rows a program
    split: int  # super-blocks a step
    num_warps: int
    stages: int = 1  # past 1: Triton pipelines the loop's loads through shared memory (tl.range)


def pairs_tiles_from_env(name: str) -> PairsTiles | None:
    """``name=block_n,split,num_warps[,stages]`` (tuning runs), else None."""
    parts = ints_from_env(name, "block_n,split,num_warps[,stages]", (3, 4))
    return None if parts is None else PairsTiles(*parts)


PROLOGUE = """.reg .b32 q, t, one, u;
.reg .f32 lo_f, hi_f;
mov.b32 one, 0x3F803F80;"""


def pair_product(word: str, shift: int, x_pair: str, acc: str, offset: str, first: bool = False) -> str:
    """PTX: ``acc (+)= (the nibbles at bits shift, shift + 16 of word, less offset) * x_pair``
    (``first``: ``acc`` starts at -0, the sum's identity)."""
    lines = [f"mov.b32 {acc}, 0x80008000;"] if first else []
    source = word
    if shift:
        lines.append(f"shr.u32 q, {word}, {shift};")
        source = "q"
    lines += [
        f"lop3.b32 t, {source}, 0x000F000F, 0x43004300, 0xEA;",
        f"fma.rn.bf16x2 t, t, one, {offset};",
        f"fma.rn.bf16x2 {acc}, t, {x_pair}, {acc};",
    ]
    return "\n".join(lines)


def halves_sum(acc: str, out: str) -> str:
    """PTX: ``out`` (float32) = the sum of the bfloat16 pair ``acc``'s halves."""
    return "\n".join([
        f"shl.b32 u, {acc}, 16;", "mov.b32 lo_f, u;",
        f"and.b32 u, {acc}, 0xFFFF0000;", "mov.b32 hi_f, u;",
        f"add.f32 {out}, lo_f, hi_f;",
    ])


def program(declarations: str, *steps: str) -> str:
    """One inline-PTX block: the shared registers, ``declarations``, then ``steps``."""
    return "{\n" + "\n".join([PROLOGUE, declarations, *steps]) + "\n}"


@triton.jit
def bf16_half(pair, HIGH: tl.constexpr):
    """float32 of the low or (``HIGH``) high bfloat16 in a uint32 ``pair``."""
    if HIGH:
        return (pair & 0xFFFF0000).to(tl.float32, bitcast=True)
    return (pair << 16).to(tl.float32, bitcast=True)
