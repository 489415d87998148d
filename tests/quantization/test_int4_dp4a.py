"""The one-token int4 GEMV on 8-bit dot products (``int4_gemv_dp4a``, W4A8)
under Triton's interpreter, against plain torch: the activations' int8
blocks (``int8_activations``) exactly as ``quantize_reference`` makes them, the GEMV equal
to the dequantized weights times the dequantized activations (float64), and
within the activations' rounding of the bfloat16 reference. The inline PTX
is checked lane by lane in ``tests/kernels/test_ptx_programs.py``."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed")

from octavo.kernels.quant import int4  # noqa: E402
from tests.quantization.helpers import switched_on  # noqa: E402
from tests.quantization.interpreter import needs_interpreter, not_interpreted, rerun_under_interpreter  # noqa: E402


@not_interpreted
def test_kernels_under_interpreter():
    rerun_under_interpreter(__file__)


@pytest.fixture
def dp4a(monkeypatch):
    from octavo.kernels.quant import int4_gemv_dp4a

    yield from switched_on(monkeypatch, int4_gemv_dp4a, "OCTAVO_INT4_GEMV_DP4A", int4_gemv_dp4a.dp4a_enabled)


@needs_interpreter
@pytest.mark.parametrize("order", ["INT4_ORDER", "NATURAL_32"])
@pytest.mark.parametrize("blocks", [1, 3, 5])  # one block; a partial program; two programs
def test_quantize_matches_reference(order, blocks):
    from octavo.kernels.quant import int8_activations

    order = getattr(int8_activations, order)
    torch.manual_seed(0)
    x = torch.randn(1, blocks * order.size, dtype=torch.bfloat16) * 3
    x[0, :7] = torch.tensor([40.0, -40.0, 0.5, -0.5, 1e-3, 0.0, 39.7])  # the block's maximum both ways
    if blocks > 1:
        x[0, order.size:2 * order.size] = 0.0  # an all-zero block: scale 0, values 0
    words, scales, sums = int8_activations.quantize(x, order)
    values, ref_scales, ref_sums = int8_activations.quantize_reference(x, order.size)
    assert words.shape == (blocks, order.size // 4)
    assert torch.equal(int8_activations.unpack_words(words, order), values)
    assert torch.equal(scales, ref_scales) and torch.equal(sums, ref_sums)
    assert values.abs().max() == 127 and values[0, 0] == 127 and values[0, 1] == -127
    # Each activation within half a step of its block's grid.
    rebuilt = values.float() * scales[:, None]
    assert ((rebuilt - x.float().reshape(-1, order.size)).abs() <= scales[:, None] / 2 + 1e-6).all()
    # Per group of four words (gguf_q4k_dp4a's quarters): the block's scale, the group's sum times it.
    _, _, _, group_scales, group_sums = int8_activations.quantize(x, order, group_words=4)
    groups = order.size // 16
    assert torch.equal(group_scales, ref_scales[:, None].expand(blocks, groups))
    word_sums = sum((words << (24 - 8 * byte)) >> 24 for byte in range(4))  # [block, word]
    expected = word_sums.reshape(blocks, groups, 4).sum(dim=2).float() * ref_scales[:, None]
    assert torch.allclose(group_sums, expected, rtol=1e-6, atol=0)


def test_int4_order_meets_the_nibbles():
    # Word i's byte l holds input i + 32 l (A words) or 16 + i + 32 l (B words): the inputs of
    # nibbles 2 l and 2 l + 1 of weight word i (input i + 16 j in nibble j).
    from octavo.kernels.quant.int8_activations import INT4_ORDER

    for c in range(32):
        for byte in range(4):
            i, high = c % 16, c // 16
            assert c * INT4_ORDER.word_stride + byte * INT4_ORDER.byte_stride == i + 16 * (2 * byte + high)


# (out features, in features, group size, dtype): a partial row tile, groups over two
# blocks, zero points at both ends (0 and legacy GPTQ's 16).
CASES = [(100, 384, 128, torch.float32), (64, 512, 256, torch.bfloat16), (40, 256, 128, torch.float16)]


@needs_interpreter
@pytest.mark.parametrize("out_features,in_features,group_size,dtype", CASES)
@pytest.mark.parametrize("with_bias", [True, False])
# Two blocks a step over three or four (the last step partial, blocks past K read block 0
# with a zero scale; or even); the default, one step.
@pytest.mark.parametrize("tiles", [(8, 2, 2), (8, 16, 8), (4, 1, 1)], ids=["8-2-2", "default", "4-1-1"])
def test_int4_gemv_dp4a_matches_reference(dp4a, out_features, in_features, group_size, dtype, with_bias, tiles):
    from octavo.kernels.quant import int4_triton, int8_activations
    from octavo.ops import quant_reference

    torch.manual_seed(1)
    qweight, scales, zeros = int4.quantize_grouped_rtn(torch.randn(out_features, in_features).to(dtype), group_size, 4)
    zeros[0, 0], zeros[-1, -1] = 16, 0
    x = torch.randn(1, in_features).to(dtype)
    bias = torch.randn(out_features).to(dtype) if with_bias else None
    out = dp4a.int4_gemv_dp4a(x, qweight, scales, zeros, group_size, bias, dp4a.Dp4aTiles(*tiles))
    assert out.dtype == dtype and out.shape == (1, out_features)

    weight = int4.dequantize_grouped(qweight, scales, zeros, group_size, 4).double()
    values, x_scales, _ = int8_activations.quantize_reference(x, 128)
    x8 = (values.double() * x_scales.double()[:, None]).reshape(1, -1)
    bias64 = bias.double() if with_bias else 0.0
    w4a8 = x8 @ weight.T + bias64
    rounding = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    assert (out.double() - w4a8).abs().max() <= rounding * w4a8.abs().max() + 1e-5
    # Against W4A16: no more than each activation's half step times its weight, per row.
    bound = (weight.abs() * x_scales.double().repeat_interleave(128)[None, :] / 2).sum(dim=1)
    reference = quant_reference.int4_linear(x, qweight, scales, zeros, group_size, bias).double()
    assert ((out.double() - reference).abs()[0] <= bound + 2 * rounding * w4a8.abs().max()).all()
    # The op's one-token dispatch goes here while the switch is on.
    if tiles == (8, 16, 8):
        assert torch.equal(int4_triton.grouped_linear(x, qweight, scales, zeros, group_size, bias, 4), out)


@needs_interpreter
def test_dp4a_path_is_opt_in_and_one_token_whole_groups(dp4a, monkeypatch):
    x = torch.randn(1, 256)
    assert dp4a.takes(x, 128, 4)
    assert not dp4a.takes(torch.randn(2, 256), 128, 4)
    assert not dp4a.takes(x, 64, 4) and not dp4a.takes(x, 128, 8)
    monkeypatch.delenv("OCTAVO_INT4_GEMV_DP4A")
    dp4a.dp4a_enabled.cache_clear()
    assert not dp4a.takes(x, 128, 4)
