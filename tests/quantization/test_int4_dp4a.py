"""The one-token int4 GEMV on 8-bit dot products (``int4_gemv_dp4a``, W4A8)
under Triton's interpreter, against plain torch: the activations' int8
blocks exactly as ``quantize_blocks_reference`` makes them, the GEMV equal
to the dequantized weights times the dequantized activations (float64), and
within the activations' rounding of the bfloat16 reference. The inline PTX
is checked lane by lane in ``tests/kernels/test_ptx_programs.py``."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed")

from octavo.kernels.quant import int4  # noqa: E402
from tests.quantization.interpreter import needs_interpreter, not_interpreted, rerun_under_interpreter  # noqa: E402


@not_interpreted
def test_kernels_under_interpreter():
    rerun_under_interpreter(__file__)


@pytest.fixture
def dp4a(monkeypatch):
    from octavo.kernels.quant import int4_gemv_dp4a

    monkeypatch.setenv("OCTAVO_INT4_GEMV_DP4A", "1")
    int4_gemv_dp4a.dp4a_enabled.cache_clear()
    yield int4_gemv_dp4a
    int4_gemv_dp4a.dp4a_enabled.cache_clear()


def _unpack_words(words: torch.Tensor) -> torch.Tensor:
    """int8 words ``[blocks, 32]`` -> values ``[blocks, 128]`` in input order (word ``16 h + i``,
    byte ``l`` holds input ``i + 16 h + 32 l``)."""
    blocks = words.shape[0]
    signed = torch.stack([(words << (24 - 8 * lane)) >> 24 for lane in range(4)], dim=1)  # [block, l, 16 h + i]
    return signed.reshape(blocks, 128)  # [block, l, h, i]: input 32 l + 16 h + i


@needs_interpreter
@pytest.mark.parametrize("num_in", [128, 384, 640])  # one block; three (a partial program); five
def test_quantize_blocks_matches_reference(dp4a, num_in):
    torch.manual_seed(0)
    x = torch.randn(1, num_in, dtype=torch.bfloat16) * 3
    x[0, :7] = torch.tensor([40.0, -40.0, 0.5, -0.5, 1e-3, 0.0, 39.7])  # the block's maximum both ways
    if num_in > 128:
        x[0, 128:256] = 0.0  # an all-zero block: scale 0, values 0
    words, scales, sums = dp4a.quantize_blocks(x)
    values, ref_scales, ref_sums = dp4a.quantize_blocks_reference(x)
    assert torch.equal(_unpack_words(words), values)
    assert torch.equal(scales, ref_scales) and torch.equal(sums, ref_sums)
    assert values.abs().max() == 127 and values[0, 0] == 127 and values[0, 1] == -127
    # Each activation within half a step of its block's grid.
    rebuilt = values.float() * scales[:, None]
    assert ((rebuilt - x.float().reshape(-1, 128)).abs() <= scales[:, None] / 2 + 1e-6).all()


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
    from octavo.kernels.quant import int4_triton
    from octavo.ops import quant_reference

    torch.manual_seed(1)
    qweight, scales, zeros = int4.quantize_grouped_rtn(torch.randn(out_features, in_features).to(dtype), group_size, 4)
    zeros[0, 0], zeros[-1, -1] = 16, 0
    x = torch.randn(1, in_features).to(dtype)
    bias = torch.randn(out_features).to(dtype) if with_bias else None
    out = dp4a.int4_gemv_dp4a(x, qweight, scales, zeros, group_size, bias, dp4a.Dp4aTiles(*tiles))
    assert out.dtype == dtype and out.shape == (1, out_features)

    weight = int4.dequantize_grouped(qweight, scales, zeros, group_size, 4).double()
    values, x_scales, _ = dp4a.quantize_blocks_reference(x)
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
    assert dp4a.takes(x, 256, 128, 4)
    assert not dp4a.takes(torch.randn(2, 256), 256, 128, 4)
    assert not dp4a.takes(x, 256, 64, 4) and not dp4a.takes(x, 256, 128, 8)
    monkeypatch.delenv("OCTAVO_INT4_GEMV_DP4A")
    dp4a.dp4a_enabled.cache_clear()
    assert not dp4a.takes(x, 256, 128, 4)
