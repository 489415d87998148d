"""``example_int8``: weight-only int8 with one scale per output channel.

The checkpoint is an ordinary floating-point one; weights are quantized once,
after loading (``process_weights_after_loading``): ``scale = max|w| / 127``
per output row (float32), ``q = round(w / scale)``. ``apply`` computes
through the layer's ``int8_weight_only_linear`` layer op (``layer.ops``),
so any platform that registers a kernel for that op accelerates this
method too, and elsewhere the op's reference runs (the weight cast to the
activation dtype, the scale on the output). Parameters keep the loader
hints of the unquantized method (``output_dim`` / ``input_dim``), so
tensor-parallel splitting works unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from octavo.quantization.base import LinearMethod, QuantizationConfig, UnquantizedLinearMethod, set_weight_attrs


class ExampleInt8LinearMethod(UnquantizedLinearMethod):
    def process_weights_after_loading(self, layer: nn.Module) -> None:
        weight = layer.weight.data.to(torch.float32)
        scale = weight.abs().amax(dim=1).clamp(min=1e-8) / 127.0
        quantized = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
        layer.weight = nn.Parameter(quantized, requires_grad=False)
        layer.weight_scale = nn.Parameter(scale, requires_grad=False)
        set_weight_attrs(layer.weight, output_dim=0, input_dim=1)

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return layer.ops.int8_weight_only_linear(x, layer.weight, layer.weight_scale, layer.bias)


class ExampleInt8Config(QuantizationConfig):
    name = "example_int8"

    @classmethod
    def from_hf_config(cls, quant_config: dict[str, Any] | None) -> "ExampleInt8Config":
        return cls()

    def get_linear_method(self, layer: nn.Module, prefix: str) -> LinearMethod:
        return ExampleInt8LinearMethod()

    def quantizes_on_load(self) -> bool:
        return True
