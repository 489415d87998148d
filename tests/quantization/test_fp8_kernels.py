"""The fp8 Triton kernels against their plain-torch references, on the CPU
through Triton's interpreter (in a subprocess, ``interpreter.py``): the
one-launch activation quantizer (per token, per group, padding rows), the
weight-only GEMV of 8-bit per-channel weights (fp8 and int8, with the fused
SiLU-and-mul), and the block-scaled fp8 GEMV and W8A8 GEMM (partial tiles,
a ragged last K block). Tiny shapes: the interpreter runs programs in Python.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed")

from octavo.kernels.quant import scaled_mm  # noqa: E402
from octavo.ops import quant_reference, reference  # noqa: E402
from tests.quantization.helpers import relative_error  # noqa: E402
from tests.quantization.interpreter import needs_interpreter, not_interpreted, rerun_under_interpreter  # noqa: E402


@not_interpreted
def test_kernels_under_interpreter():
    rerun_under_interpreter(__file__)


@needs_interpreter
@pytest.mark.parametrize("group_size", [None, 32])
def test_quantize_rows_matches_torch(group_size):
    from octavo.kernels.quant.fp8_triton import quantize_fp8_rows

    torch.manual_seed(0)
    x = torch.randn(5, 96) * torch.logspace(-3, 2, 5)[:, None]
    q, scale = quantize_fp8_rows(x, group_size, pad_rows_to=8)
    assert q.shape == (8, 96) and q.dtype == scaled_mm.FP8_DTYPE
    groups = x.reshape(5 * (96 // (group_size or 96)), -1)
    expected_q, expected_scale = scaled_mm.quantize_fp8_per_token(groups)
    assert torch.equal(scale[:5].reshape(-1, 1), expected_scale)
    assert torch.equal(q[:5].float().reshape(groups.shape), expected_q.float())
    assert q[5:].float().abs().max() == 0 and bool(torch.isfinite(scale).all())


@needs_interpreter
@pytest.mark.parametrize("weight_kind", ["fp8", "int8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_scaled_gemv(weight_kind, dtype):
    from octavo.kernels.gemv import gemv, scaled_linear_gemv

    torch.manual_seed(1)
    weight = torch.randn(2 * 24, 160) * 0.05
    quantize = scaled_mm.quantize_fp8_per_channel if weight_kind == "fp8" else scaled_mm.quantize_int8_per_channel
    qweight, scale = quantize(weight)
    x, bias = torch.randn(3, 160).to(dtype), torch.randn(2 * 24).to(dtype)
    expected = quant_reference.int8_weight_only_linear(x, qweight, scale, bias)
    # The interpreter truncates float32 -> bfloat16 casts (compiled kernels round).
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    assert relative_error(scaled_linear_gemv(x, qweight, scale, bias), expected) < tolerance
    fused = gemv(x, qweight, bias, silu_mul=True, weight_scale=scale)
    assert relative_error(fused, reference.silu_and_mul(expected)) < tolerance


def _block_case(num_tokens: int, dtype: torch.dtype):
    torch.manual_seed(2)
    weight = torch.randn(72, 160) * 0.05  # 72 rows: a partial 32-row block; 160 inputs: a partial 64-input block
    qweight, scale = scaled_mm.quantize_fp8_block(weight, 32, 64)
    x, bias = torch.randn(num_tokens, 160).to(dtype), torch.randn(72).to(dtype)
    return x, qweight, scale, bias, quant_reference.fp8_block_linear(x, qweight, scale, 32, 64, bias)


@needs_interpreter
@pytest.mark.parametrize("num_tokens", [1, 3])
def test_block_gemv(num_tokens):
    from octavo.kernels.quant.fp8_block_triton import BlockGemvConfig, block_gemv

    x, qweight, scale, bias, expected = _block_case(num_tokens, torch.float32)
    # block_n 48: narrowed to 16 rows a program, within one 32-row block of scales.
    for config in (BlockGemvConfig(block_n=4, steps=2), BlockGemvConfig(block_n=48, steps=1)):
        out = block_gemv(x, qweight, scale, 32, 64, bias, config)
        assert relative_error(out, expected) < 1e-5, config


@needs_interpreter
def test_block_gemv_whole_steps():
    """K a multiple of block_k * steps: the kernel's unmasked form."""
    from octavo.kernels.quant.fp8_block_triton import BlockGemvConfig, block_gemv

    torch.manual_seed(3)
    qweight, scale = scaled_mm.quantize_fp8_block(torch.randn(64, 256) * 0.05, 32, 64)
    x = torch.randn(2, 256)
    expected = quant_reference.fp8_block_linear(x, qweight, scale, 32, 64, None)
    out = block_gemv(x, qweight, scale, 32, 64, None, BlockGemvConfig(block_n=8, steps=2))
    assert relative_error(out, expected) < 1e-5


@needs_interpreter
@pytest.mark.parametrize("num_tokens,dtype", [(5, torch.float32), (20, torch.bfloat16)])
def test_block_scaled_mm(num_tokens, dtype):
    """W8A8 with activations quantized per 64-input group: within the fp8 op's tolerance."""
    from octavo.kernels.quant.fp8_block_triton import BlockMmConfig, block_scaled_mm, fp8_block_linear
    from octavo.ops.specs import OP_SPECS

    x, qweight, scale, bias, expected = _block_case(num_tokens, dtype)
    bound = OP_SPECS["fp8_block_linear"].tolerance[dtype].relative_norm
    out = block_scaled_mm(x, qweight, scale, 32, 64, bias, BlockMmConfig(16, 32, group_m=2, num_stages=2))
    assert out.dtype == dtype and relative_error(out, expected) < bound / 2
    assert relative_error(fp8_block_linear(x, qweight, scale, 32, 64, bias), expected) < bound / 2


@needs_interpreter
def test_fp8_w8a8_with_one_launch_quantizer():
    """The ``fp8_linear`` implementation: Triton quantizer + ``torch._scaled_mm``
    (which runs on the CPU too), against the op's reference."""
    from octavo.kernels.quant.fp8_triton import fp8_w8a8_linear
    from octavo.ops.specs import OP_SPECS

    torch.manual_seed(3)
    weight = torch.randn(48, 64) * 0.05
    qweight, scale = scaled_mm.quantize_fp8_per_channel(weight)
    x, bias = torch.randn(5, 64).to(torch.bfloat16), torch.randn(48).to(torch.bfloat16)
    expected = quant_reference.fp8_linear(x, qweight, scale, bias)
    out = fp8_w8a8_linear(x, qweight, scale, bias)
    assert out.shape == (5, 48) and relative_error(out, expected) < OP_SPECS["fp8_linear"].tolerance[torch.bfloat16].relative_norm


def test_fp8_gemms_accumulate_fast_unless_told_not_to(monkeypatch):
    # vLLM's sm90 fp8 kernels use CUTLASS's fast-accumulation schedules; so
    # does _scaled_mm here unless OCTAVO_FP8_FAST_ACCUM=0 (read once per process).
    from octavo.errors import InvalidArgumentError

    seen = []

    def fake_scaled_mm(a, b, **kwargs):
        seen.append(kwargs["use_fast_accum"])
        return torch.zeros(a.shape[0], b.shape[1], dtype=kwargs["out_dtype"])

    monkeypatch.setattr(torch, "_scaled_mm", fake_scaled_mm)
    xq, x_scale = scaled_mm.quantize_fp8_per_token(torch.randn(16, 32))
    qweight, weight_scale = scaled_mm.quantize_fp8_per_channel(torch.randn(8, 32))
    try:
        for value in (None, "0", "1"):
            if value is None:
                monkeypatch.delenv(scaled_mm.FAST_ACCUM_ENV, raising=False)
            else:
                monkeypatch.setenv(scaled_mm.FAST_ACCUM_ENV, value)
            scaled_mm.fp8_fast_accum.cache_clear()
            out = scaled_mm.fp8_scaled_mm(xq, x_scale, qweight, weight_scale, None, 2, torch.bfloat16)
            assert out.shape == (2, 8)
        assert seen == [True, False, True]
        monkeypatch.setenv(scaled_mm.FAST_ACCUM_ENV, "yes")
        scaled_mm.fp8_fast_accum.cache_clear()
        with pytest.raises(InvalidArgumentError, match="OCTAVO_FP8_FAST_ACCUM"):
            scaled_mm.fp8_fast_accum()
    finally:
        scaled_mm.fp8_fast_accum.cache_clear()
