"""fp8 W8A8 through fbgemm-gpu-genai's row-wise GEMM (``fbgemm_fp8.py``) on
the CPU: fbgemm is not installed here, so its op is defined with a float32
stand-in of the same schema, and what is checked is Octavo's side (the
codes and scales handed over, the rows sliced, the output dtype and bias,
and which batches the registered implementations take)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytest.importorskip("triton")

SCHEMA = "f8f8bf16_rowwise(Tensor XQ, Tensor WQ, Tensor x_scale, Tensor w_scale, Tensor? bias=None, bool use_fast_accum=True) -> Tensor"
CALLS: list[tuple[int, bool]] = []


def _stand_in(xq, wq, x_scale, w_scale, bias=None, use_fast_accum=True):
    CALLS.append((xq.shape[0], use_fast_accum))
    out = (xq.float() * x_scale[:, None]) @ (wq.float() * w_scale[:, None]).t()
    return out.to(torch.bfloat16)


@pytest.fixture(scope="module")
def fake_fbgemm():
    if importlib.util.find_spec("fbgemm_gpu") is not None:
        pytest.skip("fbgemm-gpu-genai is installed: its own op is tested on the GPU")
    library = torch.library.Library("fbgemm", "FRAGMENT")
    library.define(SCHEMA)
    library.impl("f8f8bf16_rowwise", _stand_in, "CPU")
    yield
    library._destroy()


def _weights(num_out=48, num_in=64):
    from octavo.kernels.quant import scaled_mm

    return scaled_mm.quantize_fp8_per_channel(torch.randn(num_out, num_in, generator=torch.Generator().manual_seed(0)) * 0.05)


def test_ops_hand_fbgemm_the_codes_and_scales_of_the_scaled_mm_path(fake_fbgemm):
    from octavo.kernels.quant import fbgemm_fp8, fp8_fused, scaled_mm

    qweight, scale = _weights()
    x = torch.randn(5, 64).to(torch.bfloat16)
    bias = torch.randn(48).to(torch.bfloat16)
    CALLS.clear()
    expected = scaled_mm.fp8_w8a8_linear(x, qweight, scale, bias)
    torch.testing.assert_close(fbgemm_fp8.fp8_linear(x, qweight, scale, bias), expected, atol=2e-2, rtol=1e-2)
    residual, norm_weight = torch.randn(5, 64).to(torch.bfloat16), torch.rand(64).to(torch.bfloat16)
    out, summed = fbgemm_fp8.fused_add_rms_norm_fp8_linear(x, residual, norm_weight, 1e-6, qweight, scale, None)
    ref, ref_summed = fp8_fused.fused_add_rms_norm_fp8_linear(x, residual, norm_weight, 1e-6, qweight, scale, None)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=1e-2)
    assert torch.equal(summed, ref_summed)
    gate_up = torch.randn(5, 128).to(torch.bfloat16)
    torch.testing.assert_close(fbgemm_fp8.silu_and_mul_fp8_linear(gate_up, qweight, scale, None),
                               fp8_fused.silu_and_mul_fp8_linear(gate_up, qweight, scale, None), atol=2e-2, rtol=1e-2)
    # The fused quantizers pad to 16 rows; fbgemm gets the 5 real ones, float32 accumulation.
    assert CALLS == [(5, False)] * 3


def test_registered_for_the_batches_past_the_gemv(monkeypatch):
    from octavo.kernels import builtin

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "fbgemm_gpu" else real_find_spec(name, *a))
    impls = {(i.op, i.name): i for i in builtin._fbgemm_impls()}
    ops = ("fp8_linear", "fused_add_rms_norm_fp8_linear", "silu_and_mul_fp8_linear")
    assert all(impls[(op, "triton_quant+fbgemm")].priority == 1 for op in ops)
    qweight, scale = _weights()
    accepts = impls[("fp8_linear", "triton_quant+fbgemm")].accepts
    limit = builtin.quant_gemv_max_tokens()
    assert not accepts(torch.zeros(limit, 64), qweight, scale, None)  # decode: the GEMV's
    assert accepts(torch.zeros(limit + 1, 64), qweight, scale, None)
    assert not accepts(torch.zeros(limit + 1, 64), *_weights(40, 64), None)  # dims not multiples of 16
