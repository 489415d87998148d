"""PTX for 4-bit values multiplied in bfloat16 pairs (sm_80+), shared by the
one-token int4, Q4_K and Q6_K GEMVs (``int4_gemv_rows``, ``gguf_q4k_pairs``,
``gguf_q6k_pairs``), and the GGUF pairs GEMVs' tiles, dispatch check and launch.

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

import torch
import triton
import triton.language as tl

from octavo.kernels.pdl import pdl_enabled
from octavo.kernels.triton_utils import interpreting, ints_from_env, runs_ptx


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


def rows_load_as_words(raw: torch.Tensor, word_bytes: int) -> bool:
    """Whether raw GGUF rows ``raw`` start, and step, on ``word_bytes`` boundaries (contiguous rows):
    a kernel may read them ``word_bytes`` at a time."""
    return raw.data_ptr() % word_bytes == 0 and raw.stride(0) % word_bytes == 0 and raw.stride(1) == 1


def takes_token(x: torch.Tensor, raw: torch.Tensor, word_bytes: int) -> bool:
    """Whether a pairs GEMV can take ``x @ W.T`` for raw rows ``raw``: one bfloat16 token where the
    PTX runs (CUDA; the interpreter runs the twins), its activations loaded four at a time
    (8-byte aligned), the weights' rows aligned to the kernel's ``word_bytes`` loads."""
    return (x.shape[0] == 1 and x.dtype == torch.bfloat16 and (runs_ptx(x.device) or interpreting())
            and x.stride(1) == 1 and x.data_ptr() % 8 == 0 and rows_load_as_words(raw, word_bytes))


def launch_gemv(kernel, x: torch.Tensor, raw: torch.Tensor, sb_bytes: int, tiles: PairsTiles) -> torch.Tensor:
    """``x @ W.T`` for one token and raw rows ``[N, row_bytes]`` of ``sb_bytes`` super-blocks
    (256 values each): ``kernel`` launched a program per ``tiles.block_n`` rows."""
    num_out, row_bytes = raw.shape
    out = torch.empty(1, num_out, dtype=x.dtype, device=x.device)
    if num_out == 0:
        return out
    pdl = pdl_enabled(x.device, 1)
    kernel[(triton.cdiv(num_out, tiles.block_n),)](
        x, raw, out, num_out, row_bytes // sb_bytes * 256, raw.stride(0),
        BLOCK_N=tiles.block_n, SPLIT=tiles.split, ASM=runs_ptx(x.device), PDL=pdl, STAGES=tiles.stages,
        num_warps=tiles.num_warps, launch_pdl=pdl,
    )
    return out


PROLOGUE = """.reg .b32 q, t, one, u;
.reg .f32 lo_f, hi_f;
mov.b32 one, 0x3F803F80;"""


def pair_product(word: str, shift: int, x_pair: str, acc: str, offset: str, first: bool = False,
                 high_bits: tuple[str, ...] = ()) -> str:
    """PTX: ``acc (+)= (the nibbles at bits shift, shift + 16 of word, less offset) * x_pair``
    (``first``: ``acc`` starts at -0, the sum's identity). ``high_bits``: PTX that ORs more
    bits of each value into ``t`` (``128 + nibble`` by then) before the offset comes off."""
    lines = [f"mov.b32 {acc}, 0x80008000;"] if first else []
    source = word
    if shift:
        lines.append(f"shr.u32 q, {word}, {shift};")
        source = "q"
    lines += [
        f"lop3.b32 t, {source}, 0x000F000F, 0x43004300, 0xEA;",
        *high_bits,
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
