"""``example_int8``: weight-only int8 with one scale per output channel.

The checkpoint is an ordinary floating-point one; weights are quantized once,
after loading (``process_weights_after_loading``): ``scale = max|w| / 127``
per output row, ``q = round(w / scale)``. ``apply`` dequantizes and runs a
plain matmul, so it runs wherever torch does; a real method would call a
fused int8 kernel there. Parameters keep the loader hints of the unquantized
method (``output_dim`` / ``input_dim``), so tensor-parallel splitting works
unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from octavo.quantization.base import LinearMethod, QuantizationConfig, UnquantizedLinearMethod, set_weight_attrs


class ExampleInt8LinearMethod(UnquantizedLinearMethod):
    def process_weights_after_loading(self, layer: nn.Module) -> None:
        weight = layer.weight.data.to(torch.float32)
        scale = weight.abs().amax(dim=1).clamp(min=1e-8) / 127.0
        quantized = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
        layer.weight = nn.Parameter(quantized, requires_grad=False)
        layer.weight_scale = nn.Parameter(scale.to(layer.weight_dtype_before_quantization), requires_grad=False)
        set_weight_attrs(layer.weight, output_dim=0, input_dim=1)

    def create_weights(self, layer, input_size, output_partition_sizes, params_dtype, bias):
        super().create_weights(layer, input_size, output_partition_sizes, params_dtype, bias)
        layer.weight_dtype_before_quantization = params_dtype

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        weight = layer.weight.to(x.dtype) * layer.weight_scale.to(x.dtype)[:, None]
        return F.linear(x, weight, layer.bias)


class ExampleInt8Config(QuantizationConfig):
    name = "example_int8"

    @classmethod
    def from_hf_config(cls, quant_config: dict[str, Any] | None) -> "ExampleInt8Config":
        return cls()

    def get_linear_method(self, layer: nn.Module, prefix: str) -> LinearMethod:
        return ExampleInt8LinearMethod()

    def quantizes_on_load(self) -> bool:
        return True
