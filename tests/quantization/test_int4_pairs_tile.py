"""The int4 tensor-core kernel with its weight tile made in bfloat16 pairs
(``int4_pairs_tile``): the PTX one lane at a time against the layout's
definition (bit for bit: ``(q - zero) * scale`` rounded once), the
activations' order against the tile's, and ``grouped_mm`` with the pairs
under Triton's interpreter against the reference and the float32 tile."""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed")

from octavo.kernels.quant import int4, int4_mm_triton  # noqa: E402
from octavo.kernels.quant.int4_pairs_tile import pair_major, takes_pairs, word_asm  # noqa: E402
from tests.kernels import ptx_emulator as emu  # noqa: E402
from tests.quantization.interpreter import needs_interpreter, not_interpreted, rerun_under_interpreter  # noqa: E402


@not_interpreted
def test_pairs_tile_under_interpreter():
    rerun_under_interpreter(__file__)


def test_word_ptx_makes_its_eight_values():
    # Outputs 0-3: planes 0-3 (bits 4 j); 4-7: planes 4-7 (bits 4 j + 16); (q - zero) * scale rounded once.
    rng = random.Random(0)
    program = word_asm()
    for _ in range(300):
        word = rng.getrandbits(32)
        zero = rng.randrange(16)
        scale = emu.bf16_value(emu.bf16_round(rng.uniform(-0.05, 0.05)))
        offset = emu.bf16_pair(-(128.0 + zero), -(128.0 + zero))
        halves = emu.run(program, [word, offset, emu.bf16_pair(scale, scale)], num_outputs=8)
        for plane, half in enumerate(halves):
            q = (word >> (4 * plane)) & 15
            assert half == emu.bf16_round((q - zero) * scale), (hex(word), zero, scale, plane)


def test_pair_major_orders_the_activations_as_the_tile():
    # Within a 128-input block, input p + 16 j + 64 h sits at 8 p + 2 j + h.
    x = torch.arange(2 * 256, dtype=torch.float32).reshape(2, 256)
    ordered = pair_major(x)
    for block in range(2):
        for p in range(16):
            for j in range(4):
                for h in range(2):
                    position = block * 128 + 8 * p + 2 * j + h
                    assert ordered[1, position] == x[1, block * 128 + p + 16 * j + 64 * h]


def test_pairs_take_bfloat16_whole_groups_only():
    x = torch.zeros(1, 256, dtype=torch.bfloat16)
    bf16, fp16 = torch.zeros(4, 2, dtype=torch.bfloat16), torch.zeros(4, 2, dtype=torch.float16)
    assert takes_pairs(x, bf16, 4, 128) and takes_pairs(x, bf16, 4, 256)
    assert not takes_pairs(x, fp16, 4, 128)  # a float16 scale rounds as bfloat16: not the same weights
    assert not takes_pairs(x, bf16, 4, 64) and not takes_pairs(x, bf16, 8, 128)
    assert not takes_pairs(x.float(), bf16, 4, 128)


# (out features, in features, group size, tokens): partial row tiles, two groups in a 256-input step.
CASES = [(24, 256, 128, 1), (40, 512, 128, 3), (16, 384, 128, 17), (32, 512, 256, 2)]
CONFIGS = [
    int4_mm_triton.GroupedMmConfig(16, 16, pairs=True),
    int4_mm_triton.GroupedMmConfig(16, 32, split_k=0, block_k=256, num_warps=4, num_stages=3, pairs=True),
    int4_mm_triton.GroupedMmConfig(16, 32, split_k=2, group_m=2, block_k=256, pairs=True),
    int4_mm_triton.GroupedMmConfig(32, 16, split_k=0, block_k=256, swap_ab=True, pairs=True),
]


@pytest.mark.parametrize("out_features,in_features,group_size,num_tokens", CASES)
@needs_interpreter
def test_grouped_mm_with_pairs_matches_reference(out_features, in_features, group_size, num_tokens):
    from octavo.kernels.quant import int4_triton
    from octavo.ops import quant_reference

    torch.manual_seed(0)
    weight = torch.randn(out_features, in_features).to(torch.bfloat16)
    qweight, scales, zeros = int4.quantize_grouped_rtn(weight, group_size, 4)
    assert scales.dtype == torch.bfloat16
    x, bias = torch.randn(num_tokens, in_features).to(torch.bfloat16), torch.randn(out_features).to(torch.bfloat16)
    expected = quant_reference.int4_linear(x, qweight, scales, zeros, group_size, bias).float()
    float_tile = int4_triton.grouped_mm(x, qweight, scales, zeros, group_size, bias, 4,
                                        config=int4_mm_triton.GroupedMmConfig(16, 16)).float()
    bound = 2e-2 * expected.abs().max()  # bfloat16 outputs (the interpreter truncates its casts)
    for config in CONFIGS:
        out = int4_triton.grouped_mm(x, qweight, scales, zeros, group_size, bias, 4, config=config)
        assert out.dtype == torch.bfloat16
        assert (out.float() - expected).abs().max() <= bound, config
        assert (out.float() - float_tile).abs().max() <= bound, config
