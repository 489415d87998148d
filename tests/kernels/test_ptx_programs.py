"""The bfloat16-pair GEMVs' inline PTX, one lane at a time through
``ptx_emulator``, against the formats' own definitions (ggml's Q4_K and Q6_K,
Octavo's int4 words): which bits make which value and which activation it
meets. Activations are small integers so that every bfloat16 product and sum
is exact and the results must be equal, not close. The GPU runs the same
strings (``benchmarks/quant_gpu.py`` checks each path against its dequantized
weight); this catches a misplaced shift before a GPU round is spent on it."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("triton", reason="Triton is not installed")

from tests.kernels import ptx_emulator as emu  # noqa: E402

CASES = 200


def _pair(lo: int, hi: int) -> int:
    return emu.bf16_pair(float(lo), float(hi))


def _xs(rng: random.Random, count: int) -> list[int]:
    return [rng.randint(-3, 3) for _ in range(count)]


def test_emulator_rounds_bfloat16_products_to_nearest_even():
    # 1 + 2**-8 is a tie between 1 and 1 + 2**-7: even (1) wins; a bit more rounds up.
    assert emu.bf16_round(1 + 2**-8) == emu.bf16_round(1.0)
    assert emu.bf16_round(1 + 2**-8 + 2**-12) == emu.bf16_round(1 + 2**-7)
    (out,) = emu.run("{\nfma.rn.bf16x2 $0, $1, $2, $3;\n}", [_pair(3, -2), _pair(5, 7), _pair(1, 0)])
    assert (emu.bf16_value(out), emu.bf16_value(out >> 16)) == (16.0, -14.0)


def test_q6k_groups_make_ggml_values():
    from octavo.kernels.quant import gguf_q6k_pairs

    rng = random.Random(0)
    for group in range(4):
        program = gguf_q6k_pairs._group_ptx(group)
        for _ in range(CASES):
            ql, qh = rng.getrandbits(32), rng.getrandbits(32)
            x = _xs(rng, 4)
            # Byte b of the lane's words: nibble group // 2 of ql, bits 2 group of qh on top, less 32.
            q = [(((ql >> (8 * b + 4 * (group // 2))) & 15) | (((qh >> (8 * b + 2 * group)) & 3) << 4)) - 32
                 for b in range(4)]
            (out,) = emu.run(program, [ql, qh, _pair(x[0], x[2]), _pair(x[1], x[3])])
            assert emu.bits_f32(out) == sum(qb * xb for qb, xb in zip(q, x)), (group, hex(ql), hex(qh), x)


def test_q4k_word_makes_ggml_values():
    from octavo.kernels.quant import gguf_q4k_pairs

    rng = random.Random(1)
    for _ in range(CASES):
        word = rng.getrandbits(32)
        low_x, high_x = _xs(rng, 4), _xs(rng, 4)
        low = [(word >> (8 * b)) & 15 for b in range(4)]
        high = [(word >> (8 * b + 4)) & 15 for b in range(4)]
        pairs = [_pair(low_x[0], low_x[2]), _pair(low_x[1], low_x[3]), _pair(high_x[0], high_x[2]),
                 _pair(high_x[1], high_x[3])]
        lo_sum, hi_sum = emu.run(gguf_q4k_pairs._WORD_ASM.value, [word, *pairs], num_outputs=2)
        assert emu.bits_f32(lo_sum) == sum(q * x for q, x in zip(low, low_x))
        assert emu.bits_f32(hi_sum) == sum(q * x for q, x in zip(high, high_x))


def test_int4_word_subtracts_the_zero_point():
    from octavo.kernels.quant import int4_gemv_rows

    rng = random.Random(2)
    for _ in range(CASES):
        word, zero = rng.getrandbits(32), rng.randint(0, 15)
        x = _xs(rng, 8)
        # Nibble j of the word is value j (planes: input i + 16 j of the block); pair j is (x_j, x_j+4).
        q = [(word >> (4 * j)) & 15 for j in range(8)]
        pairs = [_pair(x[j], x[j + 4]) for j in range(4)]
        neg_zero = zero | (zero << 16) | 0xC300C300  # as _word_dot builds it: -(128 + zero)
        (out,) = emu.run(int4_gemv_rows._WORD_DOT_BF16_ASM.value, [word, *pairs, neg_zero])
        assert emu.bits_f32(out) == sum((qj - zero) * xj for qj, xj in zip(q, x))


def test_q4k_pair_sum_adds_four_activations():
    from octavo.kernels.quant import gguf_q4k_pairs

    rng = random.Random(3)
    for _ in range(CASES):
        x = _xs(rng, 4)
        (out,) = emu.run(gguf_q4k_pairs._PAIR_SUM_ASM.value, [_pair(x[0], x[1]), _pair(x[2], x[3])])
        assert emu.bits_f32(out) == sum(x)


def test_two_halves_make_a_word():
    # int4_gemv_rows._pair_bits' join, which gguf_q6k_pairs uses for words read as 16-bit halves.
    (out,) = emu.run("{\nmov.b32 $0, {$1, $2};\n}", [0xBEEF, 0xDEAD])
    assert out == 0xDEADBEEF


def test_emulator_dp4a_signs_each_operand_by_its_type():
    # Bytes 0xFF: 255 unsigned, -1 signed; the accumulator is a signed int32.
    (out,) = emu.run("{\ndp4a.u32.s32 $0, $1, $2, $3;\n}", [0x000000FF, 0x0000FFFF, (-5) & emu.MASK])
    assert out == (255 * -1 - 5) & emu.MASK
    (out,) = emu.run("{\ndp4a.s32.s32 $0, $1, $2, $3;\n}", [0xFF, 0xFF, 0])
    assert out == 1


def test_int4_dp4a_word_meets_its_inputs_activations():
    from octavo.kernels.quant import int4_gemv_dp4a

    rng = random.Random(4)
    for _ in range(CASES):
        word = rng.getrandbits(32)
        x = [rng.randint(-127, 127) for _ in range(8)]  # nibble j's activation (input i + 16 j)
        # The activations' A word holds nibbles 0, 2, 4, 6's inputs in bytes 0-3, the B word 1, 3, 5, 7's.
        a_word = sum((x[2 * b] & 0xFF) << (8 * b) for b in range(4))
        b_word = sum((x[2 * b + 1] & 0xFF) << (8 * b) for b in range(4))
        (out,) = emu.run(int4_gemv_dp4a._WORD_DOT_ASM.value, [word, a_word, b_word])
        expected = sum(((word >> (4 * j)) & 15) * x[j] for j in range(8))
        assert out == expected & emu.MASK


def test_q4k_dp4a_word_sums_each_half_with_its_activations():
    from octavo.kernels.quant import gguf_q4k_dp4a

    rng = random.Random(5)
    for _ in range(CASES):
        word = rng.getrandbits(32)
        low_x = [rng.randint(-127, 127) for _ in range(4)]  # sub-block 2 a's four values
        high_x = [rng.randint(-127, 127) for _ in range(4)]  # sub-block 2 a + 1's, 32 on
        a_word = sum((x & 0xFF) << (8 * b) for b, x in enumerate(low_x))
        b_word = sum((x & 0xFF) << (8 * b) for b, x in enumerate(high_x))
        lo_sum, hi_sum = emu.run(gguf_q4k_dp4a._WORD_DOTS_ASM.value, [word, a_word, b_word], num_outputs=2)
        assert lo_sum == sum(((word >> (8 * b)) & 15) * x for b, x in enumerate(low_x)) & emu.MASK
        assert hi_sum == sum(((word >> (8 * b + 4)) & 15) * x for b, x in enumerate(high_x)) & emu.MASK
