"""fp8 W8A8 matmuls on fbgemm-gpu-genai's row-wise fp8 GEMM (CUTLASS,
Hopper) instead of ``torch._scaled_mm``, where it is installed
(``octavo[fbgemm]``).

Measured on an H100 (round 29 of ``benchmarks/RESULTS.md``, one
Llama-3.1-8B layer's four projections, quantization included):
``f8f8bf16_rowwise`` 146.6 us at 16 tokens against 172.6 for Octavo's
quantizer + ``_scaled_mm``, 181.1 against 187.0 at 256, 753.3 against
844.4 at 2,048. The weights stay as they are (fp8 ``[N, K]``, float32
per-channel scales): only the GEMM changes. The activations are quantized
by Octavo's own kernels (one launch, or fused into the norm / SiLU-and-mul
before the projection, ``fp8_fused``), so the codes and scales are the ones
the ``_scaled_mm`` path multiplies; the GEMM accumulates in float32
(``use_fast_accum=False``, as ``_scaled_mm``) and writes bfloat16.

Batches the weight-only GEMV takes (decode) are declined, as are weights
whose dims are not multiples of 16.
"""

from __future__ import annotations

import functools

import torch

from octavo.kernels.quant import fp8_fused, fp8_triton, scaled_mm
from octavo.kernels.quant.fbgemm_int4 import load_fbgemm, probe


def rowwise_matmul(xq, x_scale, qweight, weight_scale, bias, num_tokens: int, dtype: torch.dtype) -> torch.Tensor:
    """``scaled_mm.fp8_scaled_mm``'s contract on fbgemm's ``f8f8bf16_rowwise``."""
    out = torch.ops.fbgemm.f8f8bf16_rowwise(
        xq[:num_tokens], qweight, x_scale[:num_tokens].reshape(-1), weight_scale.reshape(-1), use_fast_accum=False
    ).to(dtype)
    return out if bias is None else out + bias


def fp8_linear(x, qweight, weight_scale, bias):
    """The ``fp8_linear`` op: Octavo's one-launch quantizer, then fbgemm's GEMM."""
    return scaled_mm.fp8_w8a8_linear(x, qweight, weight_scale, bias, quantize=fp8_triton.quantize_fp8_rows,
                                     matmul=rowwise_matmul)


def fused_add_rms_norm_fp8_linear(x, residual, norm_weight, eps, qweight, weight_scale, bias):
    """The ``fused_add_rms_norm_fp8_linear`` op: the fused norm-quantizer, then fbgemm's GEMM."""
    xq, x_scale, summed = fp8_fused.add_rms_norm_quant_fp8(x, residual, norm_weight, eps)
    return rowwise_matmul(xq, x_scale, qweight, weight_scale, bias, x.shape[0], x.dtype), summed


def silu_and_mul_fp8_linear(x, qweight, weight_scale, bias):
    """The ``silu_and_mul_fp8_linear`` op: the fused SiLU-and-mul quantizer, then fbgemm's GEMM."""
    xq, x_scale = fp8_fused.silu_and_mul_quant_fp8(x)
    return rowwise_matmul(xq, x_scale, qweight, weight_scale, bias, x.shape[0], x.dtype)


@functools.cache
def runs_on(device: torch.device) -> bool:
    """Whether fbgemm's fp8 GEMM loads and matches ``_scaled_mm`` on ``device``."""

    def compute():
        load_fbgemm()
        weight = torch.randn(256, 512, device=device, dtype=torch.bfloat16) * 0.02
        qweight, scale = scaled_mm.quantize_fp8_per_channel(weight)
        x = torch.randn(20, 512, device=device, dtype=torch.bfloat16)
        return fp8_linear(x, qweight, scale, None), scaled_mm.fp8_w8a8_linear(x, qweight, scale)

    return probe(device, "row-wise fp8 GEMM", compute, 1e-2)
