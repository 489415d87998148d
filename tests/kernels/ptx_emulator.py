"""A small emulator for the inline PTX of the bfloat16-pair GEMVs, to check
their bit picking without a GPU (``bf16_pairs``, ``gguf_q4k_pairs``,
``gguf_q6k_pairs``, ``int4_gemv_rows``) and of the int4 ``dp4a`` GEMV.

It runs one lane of a program given as ``inline_asm_elementwise`` takes it:
operands ``$0..$n`` (outputs first), ``.reg`` declarations, and the
instructions those kernels use: ``mov``, ``shr``, ``shl``, ``and``, ``lop3``,
``prmt`` (default mode), ``dp4a``, ``fma.rn.bf16x2`` and ``add.f32``. Registers hold
32-bit patterns; ``.f32`` operations read them as float32. A ``bf16x2`` fma
rounds each half once, to nearest even, as the hardware does.
"""

from __future__ import annotations

import re
import struct

MASK = 0xFFFFFFFF


def f32_bits(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


def bits_f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits & MASK))[0]


def bf16_value(half: int) -> float:
    return bits_f32((half & 0xFFFF) << 16)


def bf16_round(value: float) -> int:
    """The bfloat16 bits nearest ``value`` (ties to even), from its float32 bits; ``value``
    must be a float32 already (exact), as the sums of these tests are."""
    bits = f32_bits(value)
    rounding = 0x7FFF + ((bits >> 16) & 1)
    return ((bits + rounding) >> 16) & 0xFFFF


def bf16_pair(lo: float, hi: float) -> int:
    return bf16_round(lo) | (bf16_round(hi) << 16)


def _lop3(a: int, b: int, c: int, lut: int) -> int:
    out = 0
    for bit in range(32):
        index = (((a >> bit) & 1) << 2) | (((b >> bit) & 1) << 1) | ((c >> bit) & 1)
        # PTX's table: index from (a, b, c) with a's constant 0xF0, b's 0xCC, c's 0xAA.
        out |= ((lut >> index) & 1) << bit
    return out


def _prmt(a: int, b: int, selector: int) -> int:
    pool = (a & MASK) | ((b & MASK) << 32)
    return sum(((pool >> (8 * ((selector >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))


def _byte(word: int, lane: int, signed: bool) -> int:
    value = (word >> (8 * lane)) & 0xFF
    return value - 256 if signed and value >= 128 else value


def _dp4a(opcode: str, a: int, b: int, c: int) -> int:
    """``dp4a.atype.btype``: four byte products of ``a`` and ``b`` (each signed or not) plus ``c``."""
    _, a_type, b_type = opcode.split(".")
    total = sum(_byte(a, i, a_type == "s32") * _byte(b, i, b_type == "s32") for i in range(4))
    c_signed = c - (1 << 32) if c & 0x80000000 else c
    return (total + c_signed) & MASK


def _fma_bf16x2(a: int, b: int, c: int) -> int:
    out = 0
    for shift in (0, 16):
        exact = bf16_value(a >> shift) * bf16_value(b >> shift) + bf16_value(c >> shift)  # exact in float64
        out |= bf16_round(float(struct.unpack("<f", struct.pack("<f", exact))[0])) << shift
    return out


class Lane:
    def __init__(self, operands: list[int]):
        self.regs = {f"${i}": value & MASK for i, value in enumerate(operands)}

    def value(self, token: str) -> int:
        token = token.strip()
        if token in self.regs:
            return self.regs[token]
        if token.startswith("{"):  # {lo16, hi16}: two 16-bit registers as one word
            lo, hi = (self.value(t) for t in token.strip("{}").split(","))
            return (lo & 0xFFFF) | ((hi & 0xFFFF) << 16)
        return int(token, 0) & MASK

    def run(self, line: str) -> None:
        opcode, _, rest = line.partition(" ")
        args = [a.strip() for a in re.split(r",(?![^{]*})", rest)]
        dest, sources = args[0], [self.value(a) for a in args[1:]]
        base = opcode.split(".")[0]
        if base == "mov":
            result = sources[0]
        elif base == "shr":
            result = sources[0] >> sources[1]
        elif base == "shl":
            result = sources[0] << sources[1]
        elif base == "and":
            result = sources[0] & sources[1]
        elif base == "lop3":
            result = _lop3(*sources)
        elif base == "prmt":
            result = _prmt(*sources)
        elif base == "dp4a":
            result = _dp4a(opcode, *sources)
        elif opcode == "fma.rn.bf16x2":
            result = _fma_bf16x2(*sources)
        elif opcode == "add.f32":
            result = f32_bits(bits_f32(sources[0]) + bits_f32(sources[1]))
        else:
            raise NotImplementedError(f"PTX instruction {opcode!r}")
        if dest.startswith("{"):  # {lo16, hi16} <- a word: its halves
            lo, hi = (t.strip() for t in dest.strip("{}").split(","))
            self.regs[lo], self.regs[hi] = result & 0xFFFF, (result >> 16) & 0xFFFF
        else:
            self.regs[dest] = result & MASK


def run(program: str, inputs: list[int], num_outputs: int = 1) -> list[int]:
    """The output operands' bit patterns after one lane runs ``program`` on ``inputs``."""
    lane = Lane([0] * num_outputs + list(inputs))
    body = program.strip().strip("{}")
    for statement in body.split(";"):
        statement = statement.strip()
        if statement and not statement.startswith(".reg"):
            lane.run(statement)
    return [lane.regs[f"${i}"] for i in range(num_outputs)]
