"""Block-wise fp8 checkpoints: ``weight_block_size`` (DeepSeek-V3, Qwen3-FP8).

Tensors per linear layer: ``weight`` float8_e4m3fn ``[N, K]`` and one float32
scale per ``block_n x block_k`` block, ``[N / block_n, K / block_k]``, named
``weight_scale_inv`` (``quant_method: fp8`` with ``weight_block_size``) or
``weight_scale`` (compressed-tensors ``strategy: block``). Despite the name,
``weight_scale_inv`` multiplies: ``W = q * s``. ``apply`` is the
``fp8_block_linear`` layer op (on a GPU: a weight-only GEMV for a few
tokens, activations quantized per 1 x ``block_k`` group and a block-scaled
fp8 GEMM for more; elsewhere its reference, dequantize + matmul).

Every shard of a layer on every rank must hold whole blocks: output sizes
(per fused shard, per tensor-parallel rank) multiples of ``block_n``, input
sizes of ``block_k``; otherwise loading stops naming the layer. Block sizes
are positive, and ``block_k`` a power of two from 16 (the kernels' tiles).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from octavo.errors import QuantizationError
from octavo.kernels.quant import scaled_mm
from octavo.quantization.base import LinearMethod
from octavo.quantization.params import new_param


def check_block_size(value: Any, where: str) -> tuple[int, int]:
    """``[block_n, block_k]`` from a checkpoint's config, validated."""
    if not isinstance(value, (list, tuple)) or len(value) != 2 or not all(isinstance(v, int) for v in value):
        raise QuantizationError(f"{where}: weight block size {value!r} is not a pair of integers")
    block_n, block_k = value
    if block_n <= 0 or block_k < 16 or block_k & (block_k - 1):
        raise QuantizationError(
            f"{where}: weight block size {list(value)} is not supported "
            "(block_n positive, block_k a power of two of at least 16)"
        )
    return block_n, block_k


class Fp8BlockLinearMethod(LinearMethod):
    def __init__(self, block_n: int, block_k: int, scale_name: str = "weight_scale_inv") -> None:
        self.block_n, self.block_k = block_n, block_k
        self.scale_name = scale_name

    def create_weights(self, layer, input_size, output_partition_sizes, params_dtype, bias):
        block_n, block_k = self.block_n, self.block_k
        for size in output_partition_sizes:
            if size % block_n:
                raise QuantizationError(
                    f"{layer.prefix}: {size} output features (per shard and rank) are not whole blocks of "
                    f"weight_block_size [{block_n}, {block_k}]"
                )
        if input_size % block_k:
            raise QuantizationError(
                f"{layer.prefix}: {input_size} input features (per rank) are not whole blocks of "
                f"weight_block_size [{block_n}, {block_k}]"
            )
        num_out = sum(output_partition_sizes)
        layer.register_parameter("weight", new_param((num_out, input_size), scaled_mm.FP8_DTYPE, output_dim=0, input_dim=1))
        scale = new_param((num_out // block_n, input_size // block_k), torch.float32, output_dim=0, input_dim=1,
                          packed_dim=0, pack_factor=block_n)
        layer.register_parameter(self.scale_name, scale)
        layer.register_parameter("bias", new_param((num_out,), params_dtype, output_dim=0) if bias else None)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if self.scale_name != "weight_scale":
            layer.weight_scale = getattr(layer, self.scale_name)
            del layer._parameters[self.scale_name]

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return layer.ops.fp8_block_linear(x, layer.weight, layer.weight_scale, self.block_n, self.block_k, layer.bias)
