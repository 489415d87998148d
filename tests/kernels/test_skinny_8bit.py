"""The skinny-batch 8-bit tensor-core kernel (``skinny_8bit.py``) against the
float32 reference under the interpreter: weight-only (fp8 and int8 weights,
16-bit activations) and W8A8 (fp8 activations with per-token scales), with
split-K, bias and partial tiles; ``w8a8_matmul``'s choice by the token
count; an fp8 Llama whose W8A8 matmuls take it; and real shapes on a GPU."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")

from octavo.errors import InvalidArgumentError  # noqa: E402
from octavo.kernels.quant import scaled_mm, skinny_8bit  # noqa: E402
from octavo.kernels.quant.fp8_triton import quantize_fp8_rows  # noqa: E402
from tests.kernels.test_fp8_fused_path import FUSED_OPS, UNFUSED_OPS, _fp8_llm, greedy  # noqa: E402
from tests.plugins.fake_plugins import sandbox  # noqa: E402, F401

# (tokens, outputs, inputs, config): partial row tiles (N not a multiple of
# block_n), K steps not a multiple of the split, the auto split (0).
CASES = [
    (1, 40, 96, skinny_8bit.SkinnyConfig(16, 32, 0, 4, 2)),
    (3, 64, 256, skinny_8bit.SkinnyConfig(32, 64, 2, 4, 2)),
    (16, 70, 320, skinny_8bit.SkinnyConfig(16, 64, 3, 4, 2)),
    (5, 33, 64, skinny_8bit.SkinnyConfig(16, 64, 1, 4, 2)),
]


def _weight(kind: str, num_out: int, num_in: int, generator):
    dense = torch.randn(num_out, num_in, generator=generator) * 0.05
    if kind == "fp8":
        return scaled_mm.quantize_fp8_per_channel(dense)
    return scaled_mm.quantize_int8_per_channel(dense)


@pytest.mark.parametrize("kind", ["fp8", "int8"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}-split{c[3].split_k}")
def test_weight_only_matches_the_reference(kind, case):
    num_tokens, num_out, num_in, config = case
    generator = torch.Generator().manual_seed(num_out)
    qweight, scale = _weight(kind, num_out, num_in, generator)
    x = torch.randn(num_tokens, num_in, generator=generator).to(torch.bfloat16)
    bias = torch.randn(num_out, generator=generator).to(torch.bfloat16)
    expected = x.float() @ (qweight.float() * scale.reshape(-1, 1)).t() + bias.float()
    out = skinny_8bit.skinny_8bit_linear(x, qweight, scale.reshape(-1), bias, config=config)
    assert out.dtype == torch.bfloat16 and out.shape == (num_tokens, num_out)
    # bfloat16 output rounding only: products and sums are float32.
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=8e-3)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}-split{c[3].split_k}")
def test_w8a8_matches_the_scaled_reference(case):
    num_tokens, num_out, num_in, config = case
    generator = torch.Generator().manual_seed(num_in)
    qweight, scale = _weight("fp8", num_out, num_in, generator)
    x = torch.randn(num_tokens, num_in, generator=generator).to(torch.bfloat16)
    xq, x_scale = quantize_fp8_rows(x)
    expected = (xq.float() * x_scale) @ (qweight.float() * scale.reshape(-1, 1)).t()
    out = skinny_8bit.skinny_8bit_linear(xq, qweight, scale.reshape(-1), None, x_scale.reshape(-1), torch.bfloat16, config)
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=8e-3)


def test_refuses_more_rows_than_one_tile():
    qweight, scale = _weight("fp8", 32, 64, torch.Generator().manual_seed(0))
    x = torch.randn(skinny_8bit.MAX_TOKENS + 1, 64).to(torch.bfloat16)
    with pytest.raises(ValueError, match="rows"):
        skinny_8bit.skinny_8bit_linear(x, qweight, scale.reshape(-1), None)


def test_w8a8_matmul_takes_the_kernel_up_to_its_token_limit(monkeypatch):
    generator = torch.Generator().manual_seed(1)
    qweight, scale = _weight("fp8", 48, 128, generator)
    x = torch.randn(4, 128, generator=generator).to(torch.bfloat16)
    xq, x_scale = quantize_fp8_rows(x, pad_rows_to=16)
    calls = []
    original = skinny_8bit.skinny_8bit_linear
    monkeypatch.setattr(skinny_8bit, "skinny_8bit_linear", lambda *a, **k: calls.append(a[0].shape) or original(*a, **k))
    scaled = skinny_8bit.w8a8_matmul(xq, x_scale, qweight, scale, None, 4, torch.bfloat16)
    assert calls == []  # off by default
    monkeypatch.setenv(skinny_8bit.W8A8_MAX_TOKENS_ENV, "4")
    skinny = skinny_8bit.w8a8_matmul(xq, x_scale, qweight, scale, None, 4, torch.bfloat16)
    assert calls == [(4, 128)]  # the padding rows left out
    torch.testing.assert_close(skinny.float(), scaled.float(), atol=2e-2, rtol=8e-3)
    skinny_8bit.w8a8_matmul(xq, x_scale, qweight, scale, None, 5, torch.bfloat16)
    assert len(calls) == 1  # past the limit: _scaled_mm
    monkeypatch.setenv(skinny_8bit.W8A8_MAX_TOKENS_ENV, "17")
    with pytest.raises(InvalidArgumentError, match="OCTAVO_FP8_SKINNY_MAX_TOKENS"):
        skinny_8bit.w8a8_matmul(xq, x_scale, qweight, scale, None, 4, torch.bfloat16)


def _float32_scaled_mm(xq, x_scale, qweight, weight_scale, bias, num_tokens, dtype):
    """``fp8_scaled_mm`` in float32 (``_scaled_mm`` rounds row-wise scaled output to bfloat16)."""
    out = (xq[:num_tokens].float() * x_scale[:num_tokens]) @ (qweight.float() * weight_scale.reshape(-1, 1)).t()
    return (out if bias is None else out + bias).to(dtype)


def test_fp8_llama_runs_its_w8a8_matmuls_on_the_skinny_kernel(llama_dir, make_llm, sandbox, monkeypatch):
    """Weight-only GEMV off: every fp8 matmul is W8A8. With the skinny limit at
    16 every step of two short prompts runs on the kernel; tokens and
    logprobs equal those of the same matmuls in float32 torch."""
    calls = []
    original = skinny_8bit.skinny_8bit_linear
    monkeypatch.setattr(skinny_8bit, "skinny_8bit_linear", lambda *a, **k: calls.append(a[0].shape[0]) or original(*a, **k))
    monkeypatch.setattr(scaled_mm, "fp8_scaled_mm", _float32_scaled_mm)
    monkeypatch.setenv("OCTAVO_QUANT_GEMV_MAX_TOKENS", "0")
    expected = greedy(_fp8_llm(make_llm, llama_dir, sandbox, UNFUSED_OPS + FUSED_OPS))
    assert calls == []
    monkeypatch.setenv(skinny_8bit.W8A8_MAX_TOKENS_ENV, "16")
    got = greedy(_fp8_llm(make_llm, llama_dir, sandbox, UNFUSED_OPS + FUSED_OPS))
    assert set(calls) == {9, 2}  # the prefill step (6 + 3 tokens) and the decode steps (2 rows)
    assert [tokens for tokens, _ in got] == [tokens for tokens, _ in expected]
    for (_, ours), (_, theirs) in zip(got, expected):
        assert ours == pytest.approx(theirs, abs=1e-4)
