"""Weight-only int4: the shared linear method, and ``--quantization int4``.

GPTQ and AWQ checkpoints each have their own packing; after loading, both
are converted into Octavo's one int4 layout (``octavo.kernels.quant.int4``)
and computed by the same ``int4_linear`` layer op: the Triton dequant-GEMM
on a GPU, its reference (dequantize + matmul in torch) elsewhere. ``--quantization int4`` quantizes a 16/32-bit
checkpoint into that layout while loading (round to nearest, asymmetric,
groups of 128 inputs, or 64/32 where 128 does not divide the layer).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from octavo.errors import QuantizationError
from octavo.kernels.quant import int4 as int4_kernels
from octavo.quantization.base import LinearMethod, QuantizationConfig, UnquantizedLinearMethod
from octavo.quantization.naming import is_ignored
from octavo.quantization.params import new_param, replace_param

SUPPORTED_GROUP_SIZES_NOTE = "a multiple of 16 that divides the layer's inputs (32, 64 and 128 are usual), or -1"


def check_int4_shapes(layer: nn.Module, input_size: int, output_partition_sizes: list[int], group_size: int) -> None:
    """Refuse shapes the packing cannot hold, before any allocation."""
    if group_size % 16 or input_size % group_size:
        raise QuantizationError(
            f"{layer.prefix}: int4 group size {group_size} does not fit {input_size} inputs "
            f"(it must be {SUPPORTED_GROUP_SIZES_NOTE})"
        )
    for size in output_partition_sizes:
        if size % int4_kernels.PACK_FACTOR:
            raise QuantizationError(f"{layer.prefix}: int4 needs output sizes in multiples of 8, got {size}")


def store_int4(
    layer: nn.Module,
    values: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    input_perm: torch.Tensor | None = None,
) -> None:
    """Install Octavo's int4 layout on ``layer`` from unpacked values ``[K, N]``,
    scales ``[G, N]`` and zeros ``[G, N]``, dropping the checkpoint's tensors."""
    for name in ("weight", "qweight", "qzeros", "scales", "g_idx"):
        if name in layer._parameters:
            replace_param(layer, name, None)
    replace_param(layer, "qweight", int4_kernels.pack_int4_rows(values))
    replace_param(layer, "scales", scales.contiguous())
    replace_param(layer, "zeros", zeros.to(torch.uint8).contiguous())
    replace_param(layer, "input_perm", None if input_perm is None else input_perm.to(torch.int64))
    layer.group_size = group_size


class Int4LinearMethod(LinearMethod):
    """The compute side shared by every int4 format."""

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if layer.input_perm is not None:  # act-order: groups made contiguous at load
            x = x.index_select(-1, layer.input_perm)
        return layer.ops.int4_linear(x, layer.qweight, layer.scales, layer.zeros, layer.group_size, layer.bias)


class RtnInt4LinearMethod(Int4LinearMethod):
    def __init__(self, group_size: int) -> None:
        self.group_size = group_size

    def create_weights(self, layer, input_size, output_partition_sizes, params_dtype, bias):
        group_size = next((g for g in (self.group_size, 64, 32) if input_size % g == 0), self.group_size)
        check_int4_shapes(layer, input_size, output_partition_sizes, group_size)
        layer.group_size = group_size
        num_out = sum(output_partition_sizes)
        layer.register_parameter("weight", new_param((num_out, input_size), params_dtype, output_dim=0, input_dim=1))
        layer.register_parameter("bias", new_param((num_out,), params_dtype, output_dim=0) if bias else None)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        qweight, scales, zeros = int4_kernels.quantize_int4_rtn(layer.weight.data, layer.group_size)
        store_int4(layer, int4_kernels.unpack_int4_rows(qweight), scales, zeros, layer.group_size)


class Int4Config(QuantizationConfig):
    """``--quantization int4``: weight-only int4, quantized while loading."""

    name = "int4"

    def __init__(self, group_size: int = 128, ignored_layers: list[str] | None = None) -> None:
        self.group_size = group_size
        self.ignored_layers = list(ignored_layers or [])

    @classmethod
    def from_hf_config(cls, quant_config: dict[str, Any] | None) -> "Int4Config":
        quant_config = quant_config or {}
        return cls(int(quant_config.get("group_size", 128)), quant_config.get("ignored_layers"))

    def get_linear_method(self, layer: nn.Module, prefix: str) -> LinearMethod:
        if is_ignored(prefix, self.ignored_layers):
            return UnquantizedLinearMethod()
        return RtnInt4LinearMethod(self.group_size)

    def quantizes_on_load(self) -> bool:
        return True
