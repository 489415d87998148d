"""Weight-only grouped integers: the shared linear method, and ``--quantization int4``.

GPTQ, AWQ and compressed-tensors checkpoints each have their own packing;
after loading, all are converted into Octavo's one grouped layout
(``octavo.kernels.quant.int4``: rows contiguous along the inputs, bit
planes of 16 consecutive inputs) and computed by the same layer op --
``int4_linear`` for 4 bits, ``int8_grouped_linear`` for 8 (GPTQ 8-bit):
Triton kernels on a GPU (GEMV, tensor-core GEMM with split-K, or dequantize
+ cuBLAS, by batch size), their reference (dequantize + matmul in torch)
elsewhere. ``--quantization int4`` quantizes a 16/32-bit checkpoint into
that layout while loading (round to nearest, asymmetric, groups of 128
inputs, or 64/32 where 128 does not divide the layer).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from octavo.errors import QuantizationError
from octavo.kernels.quant import int4 as int4_kernels
from octavo.ops.specs import OP_SPECS
from octavo.quantization.base import LinearMethod, QuantizationConfig, UnquantizedLinearMethod
from octavo.quantization.naming import is_ignored
from octavo.quantization.params import new_param, replace_param

SUPPORTED_GROUP_SIZES_NOTE = "a multiple of 16 that divides the layer's inputs (32, 64 and 128 are usual), or -1"


def check_int4_shapes(
    layer: nn.Module, input_size: int, output_partition_sizes: list[int], group_size: int, bits: int = 4
) -> None:
    """Refuse shapes the packing cannot hold, before any allocation."""
    if group_size % 16 or input_size % group_size:
        raise QuantizationError(
            f"{layer.prefix}: int{bits} group size {group_size} does not fit {input_size} inputs "
            f"(it must be {SUPPORTED_GROUP_SIZES_NOTE})"
        )
    pack = 32 // bits
    for size in output_partition_sizes:
        if size % pack:
            raise QuantizationError(f"{layer.prefix}: int{bits} needs output sizes in multiples of {pack}, got {size}")


def store_grouped(
    layer: nn.Module,
    values: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    bits: int = 4,
    input_perm: torch.Tensor | None = None,
) -> None:
    """Install Octavo's grouped layout on ``layer`` from unpacked values
    ``[N, K]``, scales ``[N, G]`` and integer zeros ``[N, G]`` (output-major),
    dropping the checkpoint's tensors."""
    for name in ("weight", "qweight", "qzeros", "scales", "g_idx", "weight_packed", "weight_scale", "weight_zero_point",
                 "weight_g_idx"):
        if name in layer._parameters:
            replace_param(layer, name, None)
    replace_param(layer, "qweight", int4_kernels.pack_grouped(values, bits))
    replace_param(layer, "scales", scales.contiguous())
    replace_param(layer, "zeros", zeros.to(int4_kernels.zeros_dtype(bits)).contiguous())
    replace_param(layer, "input_perm", None if input_perm is None else input_perm.to(torch.int64))
    layer.group_size = group_size
    layer.weight_bits = bits
    take_own_layout(layer)


def take_own_layout(layer: nn.Module) -> None:
    """Hand a 4-bit layer to the ``int4_linear`` implementation with its own
    weight layout, if one serves this model and takes this layer (its
    ``repack`` returns the weights in that layout): the layer then holds
    them so and calls that implementation alone (``own_layout_op``)."""
    layer.own_layout_op = None
    layout = layer.ops.layout("int4_linear") if layer.weight_bits == 4 else None
    if layout is None:
        return
    spec = OP_SPECS["int4_linear"]
    packed = layout.repack(**{name: getattr(layer, name) for name in spec.repack_params})
    if packed is None:
        return
    expected = spec.weights
    if set(packed) != set(expected):
        raise QuantizationError(f"{layer.prefix}: {layout.label}'s repack returned {sorted(packed)}, "
                                f"expected {', '.join(expected)}")
    for name, tensor in packed.items():
        replace_param(layer, name, tensor)
    layer.own_layout_op = layout.fn


def store_int4(layer, values, scales, zeros, group_size, input_perm=None) -> None:
    """:func:`store_grouped` from input-major tensors (``[K, N]`` values,
    ``[G, N]`` scales and zeros), as GPTQ and AWQ checkpoints hold them."""
    store_grouped(layer, values.t(), scales.t(), zeros.t(), group_size, layer.weight_bits, input_perm)


class Int4LinearMethod(LinearMethod):
    """The compute side shared by every grouped-integer format (4 or 8 bits)."""

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if layer.input_perm is not None:  # act-order: groups made contiguous at load
            x = x.index_select(-1, layer.input_perm)
        op = layer.own_layout_op or (layer.ops.int4_linear if layer.weight_bits == 4 else layer.ops.int8_grouped_linear)
        return op(x, layer.qweight, layer.scales, layer.zeros, layer.group_size, layer.bias)


class RtnInt4LinearMethod(Int4LinearMethod):
    def __init__(self, group_size: int) -> None:
        self.group_size = group_size

    def create_weights(self, layer, input_size, output_partition_sizes, params_dtype, bias):
        group_size = next((g for g in (self.group_size, 64, 32) if input_size % g == 0), self.group_size)
        check_int4_shapes(layer, input_size, output_partition_sizes, group_size)
        layer.group_size, layer.weight_bits = group_size, 4
        num_out = sum(output_partition_sizes)
        layer.register_parameter("weight", new_param((num_out, input_size), params_dtype, output_dim=0, input_dim=1))
        layer.register_parameter("bias", new_param((num_out,), params_dtype, output_dim=0) if bias else None)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        qweight, scales, zeros = int4_kernels.quantize_int4_rtn(layer.weight.data, layer.group_size)
        store_grouped(layer, int4_kernels.unpack_grouped(qweight, 4), scales, zeros, layer.group_size)


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
