"""The one-token Q4_K GEMV on 8-bit dot products (``gguf_q4k_dp4a``, W4A8)
under Triton's interpreter, which runs its plain-arithmetic twin (the PTX is
checked lane by lane in ``tests/kernels/test_ptx_programs.py`` and compiled
for sm_90 in ``test_triton_compile.py``): against the dequantized weights
times the dequantized int8 activations, and within the activations' rounding
of the bfloat16 product; partial row tiles, steps past the row's last
super-block, and the layer op's dispatch."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed")

from octavo.kernels.quant.gguf_dequant import GGML_TYPES_BY_NAME, dequantize_gguf, random_gguf_rows  # noqa: E402
from tests.quantization.helpers import switched_on  # noqa: E402
from tests.quantization.interpreter import needs_interpreter, not_interpreted, rerun_under_interpreter  # noqa: E402

Q4_K = GGML_TYPES_BY_NAME["Q4_K"]


@not_interpreted
def test_q4k_dp4a_under_interpreter():
    rerun_under_interpreter(__file__)


@pytest.fixture
def dp4a(monkeypatch):
    from octavo.kernels.quant import gguf_q4k_dp4a

    yield from switched_on(monkeypatch, gguf_q4k_dp4a, "OCTAVO_GGUF_Q4K_DP4A", gguf_q4k_dp4a.dp4a_enabled)


# (rows, inputs, tiles): a partial row tile; three super-blocks in steps of two (the second
# reads past the row: zero scales); the default (one step of four over three super-blocks).
CASES = [(20, 512, (8, 2, 2)), (24, 768, (16, 2, 1)), (8, 256, (8, 1, 4)), (20, 768, (8, 4, 4))]


@needs_interpreter
@pytest.mark.parametrize("num_out,num_in,tiles", CASES)
def test_q4k_dp4a_matches_the_w4a8_product(dp4a, num_out, num_in, tiles):
    from octavo.kernels.quant import int8_activations

    generator = torch.Generator().manual_seed(num_in)
    raw = random_gguf_rows("Q4_K", num_out, num_in, generator)
    x = torch.randn(1, num_in, generator=generator).to(torch.bfloat16)
    x[0, 32:64] = 0.0  # an all-zero block of activations
    out = dp4a.q4k_gemv_dp4a(x, raw, dp4a.Dp4aTiles(*tiles))
    assert out.shape == (1, num_out) and out.dtype == torch.bfloat16
    weight = dequantize_gguf(raw, Q4_K).double()
    values, scales, _ = int8_activations.quantize_reference(x, 32)
    w4a8 = (values.double() * scales.double()[:, None]).reshape(1, -1) @ weight.T
    # The output's rounding to bfloat16 (the interpreter truncates: 2**-7 of the largest at most).
    assert (out.double() - w4a8).abs().max() <= 8e-3 * w4a8.abs().max()
    # Against the bfloat16 activations: each within half its block's step, times its weight.
    bound = (weight.abs() * scales.double().repeat_interleave(32)[None, :] / 2).sum(dim=1)
    exact = x.double() @ weight.T
    assert ((out.double() - exact).abs()[0] <= bound + 1e-2 * w4a8.abs().max()).all()
    alone = dp4a.q4k_gemv_dp4a(x, raw[:1].contiguous(), dp4a.Dp4aTiles(*tiles))
    assert torch.equal(alone[0, 0], out[0, 0])


@needs_interpreter
def test_the_layer_op_takes_one_q4k_token_there_when_switched_on(dp4a, monkeypatch):
    from octavo.kernels.quant import gguf_triton

    generator = torch.Generator().manual_seed(0)
    raw = random_gguf_rows("Q4_K", 8, 256, generator)
    x = torch.randn(1, 256, generator=generator).to(torch.bfloat16)
    assert dp4a.takes(x, raw, "Q4_K") and not dp4a.takes(x, raw, "Q6_K")
    assert not dp4a.takes(torch.randn(2, 256).to(torch.bfloat16), raw, "Q4_K")
    assert torch.equal(gguf_triton.gguf_linear(x, raw, Q4_K), dp4a.q4k_gemv_dp4a(x, raw))
    monkeypatch.delenv("OCTAVO_GGUF_Q4K_DP4A")
    dp4a.dp4a_enabled.cache_clear()
    assert not dp4a.takes(x, raw, "Q4_K")
