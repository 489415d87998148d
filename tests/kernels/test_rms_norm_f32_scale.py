"""The Gemma / OLMo 2 RMSNorm kernel (scaled in float32, by offset + weight,
rounded once) against its reference, as rounded on the device: rows, the
residual form, per-head views of a wider row, both offsets, and the
sandwich form (norm, add, norm)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels.rms_norm import (  # noqa: E402
    fused_add_rms_norm_f32_scale,
    post_norm_add_rms_norm_f32_scale,
    rms_norm_f32_scale,
)
from octavo.ops.reference import fused_add_rms_norm_f32_scale as fused_reference  # noqa: E402
from octavo.ops.reference import post_norm_add_rms_norm_f32_scale as sandwich_reference  # noqa: E402
from octavo.ops.reference import rms_norm_f32_scale as reference  # noqa: E402
from tests.kernels.tolerances import INTERPRETING, assert_same_rounding  # noqa: E402


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    # One float32 reduction order against another: equal up to its last bit,
    # so the rounded outputs may differ by one ulp of their dtype (two under
    # the interpreter, which truncates the residual sum and the output).
    assert actual.dtype == expected.dtype
    if actual.dtype == torch.float32:
        torch.testing.assert_close(actual, expected, atol=1e-6, rtol=1e-5)
    else:
        torch.testing.assert_close(actual, expected, atol=0, rtol=2**-6 if INTERPRETING else 2**-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("weight_offset", [0.0, 1.0])
def test_rows_and_residual(dtype, weight_offset, device):
    gen = torch.Generator().manual_seed(0)
    x, residual = (torch.randn(7, 200, generator=gen) * 3).to(device, dtype), torch.randn(7, 200, generator=gen).to(device, dtype)
    weight = torch.randn(200, generator=gen).to(device, dtype)
    _close(rms_norm_f32_scale(x, weight, 1e-6, weight_offset), reference(x, weight, 1e-6, weight_offset))
    normed, summed = fused_add_rms_norm_f32_scale(x, residual, weight, 1e-6, weight_offset)
    expected_normed, expected_summed = fused_reference(x, residual, weight, 1e-6, weight_offset)
    assert_same_rounding(summed, expected_summed)
    _close(normed, expected_normed)


def test_per_head_views_of_a_wider_row(device):
    # Gemma 3's q/k norms: [tokens, heads, head_size] views of the fused qkv output.
    gen = torch.Generator().manual_seed(1)
    qkv = torch.randn(5, 4 * 32 + 64, generator=gen).to(device, torch.bfloat16)
    q = qkv[:, : 4 * 32].view(5, 4, 32)
    weight = torch.randn(32, generator=gen).to(device, torch.bfloat16)
    _close(rms_norm_f32_scale(q, weight, 1e-6, 1.0), reference(q, weight, 1e-6, 1.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("weight_offset", [0.0, 1.0])
@pytest.mark.parametrize("hidden", [200, 256])
def test_norm_add_norm_of_the_sandwich_layer(dtype, weight_offset, hidden, device):
    # A block's output (large, as attention and MLP outputs are), its norm
    # added to the residual, then the next block's norm.
    gen = torch.Generator().manual_seed(2)
    x = (torch.randn(5, hidden, generator=gen) * 40).to(device, dtype)
    residual = torch.randn(5, hidden, generator=gen).to(device, dtype)
    post_weight, weight = (torch.randn(hidden, generator=gen).to(device, dtype) for _ in range(2))
    normed, summed = post_norm_add_rms_norm_f32_scale(x, residual, post_weight, weight, 1e-6, weight_offset)
    expected_normed, expected_summed = sandwich_reference(x, residual, post_weight, weight, 1e-6, weight_offset)
    assert normed.dtype == summed.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(summed, expected_summed, atol=1e-5, rtol=1e-5)
        _close(normed, expected_normed)
    else:
        # The sum rounds the first norm's output, itself within an ulp (two
        # under the interpreter): the sums may be an ulp of the larger term
        # apart, and the second norm is checked on the kernel's own sum.
        torch.testing.assert_close(summed, expected_summed, atol=2**-5, rtol=2**-6)
        _close(normed, reference(summed, weight, 1e-6, weight_offset))
    with pytest.raises(ValueError, match="residual shape"):
        post_norm_add_rms_norm_f32_scale(x, residual[:2], post_weight, weight, 1e-6, weight_offset)
