"""The one-token fp8 weight-only GEMV with activations shared by rows
(``fp8_gemv_rows``) under Triton's interpreter, which runs its plain-arithmetic
twin (the PTX is compiled for sm_90 in ``test_triton_compile.py`` and timed on
the GPU): partial row tiles, a step past K, e4m3's signed zeros, subnormals and
extremes, and the ``fp8_linear`` GEMV's dispatch to it."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed")

from tests.quantization.interpreter import needs_interpreter, not_interpreted, rerun_under_interpreter  # noqa: E402


@not_interpreted
def test_fp8_gemv_rows_under_interpreter():
    rerun_under_interpreter(__file__)


def _weights(num_out: int, num_in: int, generator: torch.Generator) -> torch.Tensor:
    w = (torch.randn(num_out, num_in, generator=generator) * 100).to(torch.float8_e4m3fn)
    # Signed zeros, subnormals (|v| < 2**-6), the largest values, a normal fraction.
    w[0, :8] = torch.tensor([0.0, -0.0, 2.0**-9, -(2.0**-7), 448.0, -448.0, 2.0**-6, -3.5]).to(torch.float8_e4m3fn)
    return w


# (rows, inputs, tiles): partial row tiles; 384 inputs in steps of two chunks (the second
# step reads past K: zero weights); bias or none.
CASES = [(20, 384, (8, 2, 2), True), (40, 512, (32, 2, 4), False), (16, 256, (16, 1, 1), True)]


@needs_interpreter
@pytest.mark.parametrize("num_out,num_in,tiles,with_bias", CASES)
def test_fp8_gemv_rows_matches_the_dequantized_matmul(num_out, num_in, tiles, with_bias):
    from octavo.kernels.quant import fp8_gemv_rows

    generator = torch.Generator().manual_seed(num_in)
    w = _weights(num_out, num_in, generator)
    scale = torch.rand(num_out, generator=generator) + 0.5
    bias = torch.randn(num_out, generator=generator).to(torch.bfloat16) if with_bias else None
    x = torch.randn(1, num_in, generator=generator).to(torch.bfloat16)
    expected = x.float() @ (w.float() * scale[:, None]).T
    if bias is not None:
        expected += bias.float()
    out = fp8_gemv_rows.fp8_gemv_rows(x, w, scale, bias, fp8_gemv_rows.Fp8RowsTiles(*tiles))
    assert out.shape == (1, num_out) and out.dtype == torch.bfloat16
    # float32 products and sums: the only rounding is the output's to bfloat16, within one
    # ulp (the interpreter truncates float32 -> bfloat16 instead of rounding).
    ulp = expected.abs().clamp(min=1e-30) * 2.0**-7
    assert bool(((out.float() - expected).abs() <= ulp).all())


@needs_interpreter
def test_the_fp8_gemv_takes_one_bfloat16_token_there_when_on(monkeypatch):
    """Off by default (slower than gemv.py's 8-bit form on the H200, round 35);
    ``OCTAVO_FP8_GEMV_ROWS=1`` sends one bfloat16 token of whole chunks here."""
    from octavo.kernels import gemv
    from octavo.kernels.quant import fp8_gemv_rows

    generator = torch.Generator().manual_seed(0)
    w = _weights(24, 256, generator)
    scale = torch.rand(24, generator=generator) + 0.5
    x = torch.randn(1, 256, generator=generator).to(torch.bfloat16)
    monkeypatch.delenv("OCTAVO_FP8_GEMV_ROWS", raising=False)
    fp8_gemv_rows.rows_enabled.cache_clear()
    assert not fp8_gemv_rows.takes(x, w)  # the default
    monkeypatch.setenv("OCTAVO_FP8_GEMV_ROWS", "1")
    fp8_gemv_rows.rows_enabled.cache_clear()
    assert fp8_gemv_rows.takes(x, w)
    assert torch.equal(gemv.scaled_linear_gemv(x, w, scale, None), fp8_gemv_rows.fp8_gemv_rows(x, w, scale, None))
    assert not fp8_gemv_rows.takes(torch.cat([x, x]), w) and not fp8_gemv_rows.takes(x.half(), w)
    assert not fp8_gemv_rows.takes(x[:, :200], w[:, :200].contiguous())  # not whole 128-value chunks
    assert not fp8_gemv_rows.takes(torch.randn(1, 257).to(torch.bfloat16)[:, 1:], w)  # activations off alignment
    monkeypatch.setenv("OCTAVO_FP8_GEMV_ROWS", "0")
    fp8_gemv_rows.rows_enabled.cache_clear()
    try:
        assert not fp8_gemv_rows.takes(x, w)
        expected = x.float() @ (w.float() * scale[:, None]).T
        out = gemv.scaled_linear_gemv(x, w, scale, None)  # gemv.py's 8-bit form
        assert ((out.float() - expected).norm() / expected.norm()).item() < 1e-2
    finally:
        fp8_gemv_rows.rows_enabled.cache_clear()
