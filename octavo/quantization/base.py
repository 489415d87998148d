"""The quantization-method interface.

A ``QuantizationConfig`` is the checkpoint-level side: it reads the
checkpoint's ``quantization_config`` (``from_hf_config``) and picks a
``LinearMethod`` for each linear layer (``get_linear_method``). A
``LinearMethod`` is the per-layer side: it creates the layer's parameters
(``create_weights``), converts them once after loading
(``process_weights_after_loading``), and computes the layer (``apply``).

Parameters carry loader hints as attributes, so that one weight loader serves
every format and every tensor-parallel split:

* ``output_dim`` / ``input_dim``: which tensor dim holds output / input features;
* ``packed_dim`` and ``pack_factor``: that dim holds ``pack_factor`` values per
  element (int4 packed in int32);
* ``shard_scalar``: one value per logical shard (q, k, v), e.g. a per-tensor scale.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn


class LinearMethod(ABC):
    @abstractmethod
    def create_weights(
        self,
        layer: nn.Module,
        input_size: int,
        output_partition_sizes: list[int],
        params_dtype: torch.dtype,
        bias: bool,
    ) -> None:
        """Register the layer's parameters; ``output_partition_sizes`` are the
        per-shard output sizes on this rank (one entry unless fused)."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Repack or quantize the loaded weights; called once, after loading."""

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T + b`` for this layer. ``layer.ops`` (plugin API 1.1) is the
        model's resolved ``LayerOps``: compute through its op for the format
        (``fp8_linear``, ``int4_linear``, ...) so that platforms can accelerate it."""

    def weight_bytes(self, layer: nn.Module) -> int:
        return sum(p.numel() * p.element_size() for p in layer.parameters())


def set_weight_attrs(param: torch.Tensor, **attrs: Any) -> None:
    for key, value in attrs.items():
        setattr(param, key, value)


class UnquantizedLinearMethod(LinearMethod):
    def create_weights(self, layer, input_size, output_partition_sizes, params_dtype, bias):
        weight = nn.Parameter(torch.empty(sum(output_partition_sizes), input_size, dtype=params_dtype), requires_grad=False)
        set_weight_attrs(weight, output_dim=0, input_dim=1)
        layer.register_parameter("weight", weight)
        if bias:
            bias_param = nn.Parameter(torch.empty(sum(output_partition_sizes), dtype=params_dtype), requires_grad=False)
            set_weight_attrs(bias_param, output_dim=0)
            layer.register_parameter("bias", bias_param)
        else:
            layer.register_parameter("bias", None)

    def apply(self, layer, x):
        # The ``linear`` layer op the layer was built with (a skinny-batch
        # kernel at decode where the platform has one); F.linear for a layer
        # that is not a LinearBase.
        ops = getattr(layer, "ops", None)
        if ops is None:
            return F.linear(x, layer.weight, layer.bias)
        return ops.linear(x, layer.weight, layer.bias)


class QuantizationConfig(ABC):
    """A quantization format, as a plugin registers it."""

    name: ClassVar[str]

    @classmethod
    @abstractmethod
    def from_hf_config(cls, quant_config: dict[str, Any] | None) -> "QuantizationConfig":
        """Build from the checkpoint's ``quantization_config`` (None: quantize on load)."""

    @abstractmethod
    def get_linear_method(self, layer: nn.Module, prefix: str) -> LinearMethod:
        """The method for the linear layer named ``prefix``."""

    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    def quantizes_on_load(self) -> bool:
        """True when unquantized checkpoints are quantized while loading."""
        return False

    def checkpoint_weight_names(self) -> list[str]:
        """Suffixes of the checkpoint tensors this format reads, besides ``weight``."""
        return []
