"""The fp8 quantizer fused into the op before a W8A8 projection
(``octavo/kernels/quant/fp8_fused.py``), on the CPU through Triton's
interpreter (in a subprocess, ``interpreter.py``): the fused launches
quantize exactly the values the two launches they replace quantize (the
Triton norm or SiLU-and-mul, then the one-launch quantizer), to the same
fp8 codes and scales; padding rows are zeros; the ops' outputs equal the
unfused W8A8 path's (``torch._scaled_mm`` runs on the CPU) and are within
the fp8 tolerance of their references; the ops decline what they cannot take.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed")

from octavo.kernels.builtin import _norm_fp8_accepts, _silu_fp8_accepts  # noqa: E402
from octavo.kernels.quant import scaled_mm  # noqa: E402
from octavo.ops import OP_SPECS  # noqa: E402
from tests.quantization.helpers import relative_error  # noqa: E402
from tests.quantization.interpreter import needs_interpreter, not_interpreted, rerun_under_interpreter  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16]


@not_interpreted
def test_kernels_under_interpreter():
    rerun_under_interpreter(__file__)


def _fp8_weight(out_features: int, in_features: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return scaled_mm.quantize_fp8_per_channel(torch.randn(out_features, in_features, generator=gen) * 0.05)


@needs_interpreter
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens, hidden", [(3, 96), (17, 200)])
def test_norm_quantizer_matches_norm_then_quantizer(dtype, num_tokens, hidden):
    from octavo.kernels.quant.fp8_fused import add_rms_norm_quant_fp8
    from octavo.kernels.quant.fp8_triton import quantize_fp8_rows
    from octavo.kernels.rms_norm import fused_add_rms_norm

    torch.manual_seed(0)
    # Rows of very different magnitudes: each gets its own scale.
    x = (torch.randn(num_tokens, hidden) * torch.logspace(-2, 2, num_tokens)[:, None]).to(dtype)
    residual, weight = torch.randn(num_tokens, hidden).to(dtype), torch.randn(hidden).to(dtype)
    q, scale, summed = add_rms_norm_quant_fp8(x, residual, weight, 1e-5)

    normed, expected_sum = fused_add_rms_norm(x, residual, weight, 1e-5)
    expected_q, expected_scale = quantize_fp8_rows(normed, pad_rows_to=16)
    assert q.shape == expected_q.shape == (16 * -(-num_tokens // 16), hidden) and q.dtype == scaled_mm.FP8_DTYPE
    assert torch.equal(summed, expected_sum)
    assert torch.equal(scale, expected_scale)
    assert torch.equal(q.float(), expected_q.float())
    assert q[num_tokens:].float().abs().max() == 0 and bool((scale[num_tokens:] == scaled_mm.MIN_SCALE).all())


@needs_interpreter
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens, intermediate", [(1, 48), (18, 300)])
def test_silu_quantizer_matches_silu_then_quantizer(dtype, num_tokens, intermediate):
    from octavo.kernels.activation import silu_and_mul
    from octavo.kernels.quant.fp8_fused import silu_and_mul_quant_fp8
    from octavo.kernels.quant.fp8_triton import quantize_fp8_rows

    torch.manual_seed(1)
    # A strided view (a wider buffer's columns), as a fused output may be.
    x = (torch.randn(num_tokens, 2 * intermediate + 8) * 4)[:, : 2 * intermediate].to(dtype)
    q, scale = silu_and_mul_quant_fp8(x)
    expected_q, expected_scale = quantize_fp8_rows(silu_and_mul(x), pad_rows_to=16)
    assert torch.equal(scale, expected_scale)
    assert torch.equal(q.float(), expected_q.float())
    assert q[num_tokens:].float().abs().max() == 0


@needs_interpreter
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
def test_fused_ops_equal_the_unfused_w8a8_path(dtype, bias):
    from octavo.kernels.activation import silu_and_mul
    from octavo.kernels.quant import fp8_fused
    from octavo.kernels.quant.fp8_triton import fp8_w8a8_linear
    from octavo.kernels.rms_norm import fused_add_rms_norm

    torch.manual_seed(2)
    num_tokens, hidden, out_features = 5, 64, 48
    qweight, weight_scale = _fp8_weight(out_features, hidden, seed=3)
    b = torch.randn(out_features).to(dtype) if bias else None
    x, residual = torch.randn(num_tokens, hidden).to(dtype), torch.randn(num_tokens, hidden).to(dtype)
    norm_weight = torch.randn(hidden).to(dtype)
    args = (x, residual, norm_weight, 1e-6, qweight, weight_scale, b)
    out, summed = fp8_fused.fused_add_rms_norm_fp8_linear(*args)
    normed, expected_sum = fused_add_rms_norm(x, residual, norm_weight, 1e-6)
    assert out.dtype == dtype and out.shape == (num_tokens, out_features)
    assert torch.equal(out, fp8_w8a8_linear(normed, qweight, weight_scale, b))
    assert torch.equal(summed, expected_sum)
    reference_out, reference_sum = OP_SPECS["fused_add_rms_norm_fp8_linear"].reference(*args)
    assert relative_error(out, reference_out) < 0.08
    # The interpreter truncates float32 -> bfloat16 casts where torch rounds.
    torch.testing.assert_close(summed, reference_sum, rtol=0 if dtype == torch.float32 else 1e-2, atol=0)

    gate_up = torch.randn(num_tokens, 2 * hidden).to(dtype)
    out = fp8_fused.silu_and_mul_fp8_linear(gate_up, qweight, weight_scale, b)
    assert torch.equal(out, fp8_w8a8_linear(silu_and_mul(gate_up), qweight, weight_scale, b))
    reference_out = OP_SPECS["silu_and_mul_fp8_linear"].reference(gate_up, qweight, weight_scale, b)
    assert relative_error(out, reference_out) < 0.08


def test_fused_ops_decline_what_the_composition_serves_better():
    qweight, weight_scale = _fp8_weight(48, 64, seed=4)
    norm_accepts, silu_accepts = _norm_fp8_accepts(2), _silu_fp8_accepts(2)
    x, weight = torch.randn(3, 64, dtype=torch.bfloat16), torch.ones(64, dtype=torch.bfloat16)
    assert norm_accepts(x, x, weight, 1e-6, qweight, weight_scale, None)
    # Decode batches the GEMV takes, a float32 norm weight, a weight _scaled_mm refuses.
    assert not norm_accepts(x[:2], x[:2], weight, 1e-6, qweight, weight_scale, None)
    assert not norm_accepts(x, x, weight.float(), 1e-6, qweight, weight_scale, None)
    assert not norm_accepts(x, x, weight, 1e-6, qweight[:40], weight_scale[:40], None)
    gate_up = torch.randn(3, 128, dtype=torch.bfloat16)
    assert silu_accepts(gate_up, qweight, weight_scale, None)
    assert not silu_accepts(gate_up[:2], qweight, weight_scale, None)
    assert not silu_accepts(gate_up, qweight[:40], weight_scale[:40], None)
