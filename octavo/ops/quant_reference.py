"""Plain-torch references of the quantized GEMM ops, one per weight format.

Each is the meaning of its op: dequantize the weight exactly as the format
defines it (``octavo.kernels.quant``), then an ordinary matmul; W8A8 ops
also define how activations are quantized. Implementations (a Triton
dequant-GEMM, ``torch._scaled_mm``, a vendor's kernel) are tested against
these within the op's tolerance. All take ``x`` as ``[num_tokens, K]`` in
the activation dtype and return ``[num_tokens, N]`` in that dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from octavo.kernels.quant.gguf_dequant import GGMLType, dequantize_gguf
from octavo.kernels.quant.int4 import dequantize_grouped
from octavo.kernels.quant.scaled_mm import dequantize_fp8_block, quantize_int8_per_token, weight_only_linear
from octavo.ops import reference


def fp8_linear(
    x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``x @ (qweight * weight_scale[:, None]).T + bias``.

    ``qweight``: float8_e4m3fn ``[N, K]``; ``weight_scale``: float32 ``[N]``
    (one per output channel). The reference casts the weight to ``x.dtype``
    (exact) and scales the output. An implementation may also quantize the
    activations to fp8 per token (W8A8, as ``torch._scaled_mm`` does): the
    op's tolerance allows for it.
    """
    return weight_only_linear(x, qweight, weight_scale, bias)


def fp8_block_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    weight_scale: torch.Tensor,
    block_n: int,
    block_k: int,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """``x @ W.T + bias`` for a block-scaled fp8 weight (DeepSeek-V3, Qwen3-FP8).

    ``qweight``: float8_e4m3fn ``[N, K]``; ``weight_scale``: float32
    ``[ceil(N / block_n), ceil(K / block_k)]``, contiguous; ``W[n, k] =
    q[n, k] * weight_scale[n // block_n, k // block_k]``, in float32 rounded
    once to ``x.dtype``. An implementation may quantize the activations to
    fp8 per token and per ``block_k`` group (W8A8): the op's tolerance allows it.
    """
    return F.linear(x, dequantize_fp8_block(qweight, weight_scale, block_n, block_k, x.dtype), bias)


def int8_linear(
    x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """W8A8 int8: activations quantized per token (symmetric, ``amax / 127``,
    round to nearest), times the int8 weight ``[N, K]`` with float32
    ``weight_scale [N]``; the integer product is exact (int32 or float32
    accumulation), then scaled by both scales in float32 and rounded to
    ``x.dtype``."""
    xq, x_scale = quantize_int8_per_token(x)
    acc = xq.to(torch.float32) @ qweight.to(torch.float32).t()
    out = (acc * x_scale * weight_scale.reshape(1, -1)).to(x.dtype)
    return out if bias is None else out + bias


def int8_weight_only_linear(
    x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``x @ (qweight * weight_scale[:, None]).T + bias`` for an int8 ``[N, K]``
    weight with float32 per-channel ``weight_scale [N]``; activations untouched."""
    return weight_only_linear(x, qweight, weight_scale, bias)


def int4_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """``x @ W.T + bias`` for Octavo's int4 layout (``octavo.kernels.quant.int4``).

    ``qweight``: int32 ``[N, K // 8]`` (inputs in blocks of ``8 * P``, ``P =
    plane_words(K, 4)``: word ``i`` of a block holds its inputs ``i + P * j``
    in nibble ``j``); ``scales``: ``[N, K // group_size]`` in ``x.dtype``;
    ``zeros``: uint8 ``[N, K // group_size]``; ``W[n, k] = (q[n, k] -
    zeros[n, g]) * scales[n, g]``, ``g = k // group_size``, in float32
    rounded once to ``x.dtype``. Act-order permutations are applied by the caller.
    """
    return F.linear(x, dequantize_grouped(qweight, scales, zeros, group_size, 4, x.dtype), bias)


def int8_grouped_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """``int4_linear``'s contract with 8-bit values (GPTQ 8-bit): ``qweight``
    int32 ``[N, K // 4]`` (blocks of ``4 * P`` inputs, ``P = plane_words(K,
    8)``; word ``i`` holds input ``i + P * j`` in byte ``j``), ``zeros`` int16
    (0..256)."""
    return F.linear(x, dequantize_grouped(qweight, scales, zeros, group_size, 8, x.dtype), bias)


def gguf_linear(x: torch.Tensor, qweight: torch.Tensor, ggml_type: GGMLType) -> torch.Tensor:
    """``x @ W.T`` for raw ggml rows: ``qweight`` uint8 ``[N, row_bytes]`` of
    ``ggml_type`` (``octavo.kernels.quant.gguf_dequant``: F32/F16/BF16, Q8_0,
    Q4_0, Q4_K, Q5_K, Q6_K), dequantized in float32 then rounded to
    ``x.dtype``. No bias: the GGUF method adds it."""
    return F.linear(x, dequantize_gguf(qweight, ggml_type, x.dtype))


def fused_add_rms_norm_fp8_linear(
    x: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    qweight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(fp8_linear(normed, qweight, weight_scale, bias), summed)`` where
    ``(normed, summed) = fused_add_rms_norm(x, residual, norm_weight, eps)``:
    the residual add and RMSNorm before a layer's first fp8 projection (qkv,
    gate-up). An implementation may quantize the norm's output to fp8 per
    token in the norm's own pass (W8A8), as ``fp8_linear`` may."""
    normed, summed = reference.fused_add_rms_norm(x, residual, norm_weight, eps)
    return fp8_linear(normed, qweight, weight_scale, bias), summed


def silu_and_mul_fp8_linear(
    x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``fp8_linear(silu_and_mul(x), qweight, weight_scale, bias)``: a gated
    MLP's activation and its fp8 down projection; ``x`` is the gate-up
    output ``[num_tokens, 2 * I]``. An implementation may quantize the
    activation's output to fp8 per token in the activation's pass (W8A8)."""
    return fp8_linear(reference.silu_and_mul(x), qweight, weight_scale, bias)
