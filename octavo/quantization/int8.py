"""INT8 linear layers, quantized while loading (or read from compressed-tensors).

Two methods, chosen by name:

* ``int8`` -- W8A8: per-channel symmetric int8 weights and dynamic
  per-token symmetric int8 activations: the ``int8_linear`` layer op,
  ``torch._int_mm`` (int32 accumulation) where the probe says it runs (CPU,
  CUDA), elsewhere its reference (the same integer product in float32);
* ``int8_weight_only`` -- per-channel int8 weights, activations untouched
  (the ``int8_weight_only_linear`` op: the int8 weight cast to the
  activation dtype, the scale applied to the output).

Weight error bound: ``|W - dq| <= scale / 2`` per element, with
``scale = amax(|W[n]|) / 127``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from octavo.kernels.quant import scaled_mm
from octavo.quantization.base import LinearMethod, QuantizationConfig, UnquantizedLinearMethod
from octavo.quantization.naming import is_ignored
from octavo.quantization.params import create_channel_scaled_weights, replace_param


class Int8LinearMethod(LinearMethod):
    def __init__(self, serialized: bool, w8a8: bool) -> None:
        self.serialized = serialized
        self.w8a8 = w8a8

    def create_weights(self, layer, input_size, output_partition_sizes, params_dtype, bias):
        serialized_dtype = torch.int8 if self.serialized else None
        create_channel_scaled_weights(layer, input_size, output_partition_sizes, params_dtype, bias, serialized_dtype)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if self.serialized:
            weight, scale = layer.weight.data, layer.weight_scale.data
        else:
            weight, scale = scaled_mm.quantize_int8_per_channel(layer.weight.data)
        replace_param(layer, "weight", weight)
        replace_param(layer, "weight_scale", scale.contiguous())

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        op = layer.ops.int8_linear if self.w8a8 else layer.ops.int8_weight_only_linear
        return op(x, layer.weight, layer.weight_scale, layer.bias)


class Int8Config(QuantizationConfig):
    """``--quantization int8``: W8A8, quantized while loading."""

    name = "int8"
    w8a8 = True

    def __init__(self, ignored_layers: list[str] | None = None) -> None:
        self.ignored_layers = list(ignored_layers or [])

    @classmethod
    def from_hf_config(cls, quant_config: dict[str, Any] | None) -> "Int8Config":
        return cls((quant_config or {}).get("ignored_layers"))

    def get_linear_method(self, layer: nn.Module, prefix: str) -> LinearMethod:
        if is_ignored(prefix, self.ignored_layers):
            return UnquantizedLinearMethod()
        return Int8LinearMethod(serialized=False, w8a8=self.w8a8)

    def quantizes_on_load(self) -> bool:
        return True


class Int8WeightOnlyConfig(Int8Config):
    """``--quantization int8_weight_only``: int8 weights, 16/32-bit activations."""

    name = "int8_weight_only"
    w8a8 = False
