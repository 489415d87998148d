"""FP8 (e4m3) linear layers: checkpoints in the ``fp8`` layout, and
``--quantization fp8`` to quantize 16/32-bit checkpoints while loading.

Checkpoint layout (``quantization_config.quant_method == "fp8"``, as written
by AutoFP8 / llm-compressor / vLLM): ``weight`` float8_e4m3fn ``[N, K]``,
``weight_scale`` float32, per tensor (one value) or per channel (``[N]`` or
``[N, 1]``), and an optional static ``input_scale``, which Octavo does not
need: activations are always scaled per token, dynamically, which is at
least as accurate. Block-wise scales (``weight_block_size``, e.g. [128,
128]) load with the block-scaled method (``fp8_block``).

After loading every layer holds a per-channel ``weight_scale [N]``: a fused
layer whose shards came with different per-tensor scales keeps each shard's
scale on its rows, so no weight is requantized. ``apply`` is the
``fp8_linear`` layer op. On a GPU: for a few tokens (decode) a weight-only
Triton GEMV that streams the fp8 weight (half of bfloat16's bytes) and
scales each output; for more, activations quantized per token in one
Triton launch, then ``torch._scaled_mm`` (CUDA compute capability >= 8.9,
weight dims in multiples of 16). Elsewhere its reference, the weight-only
path (fp8 weight cast to the activation dtype, per-channel scale on the
output) -- the CPU's path.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from octavo.errors import QuantizationError
from octavo.kernels.quant import scaled_mm
from octavo.quantization.base import LinearMethod, QuantizationConfig, UnquantizedLinearMethod
from octavo.quantization.fp8_block import Fp8BlockLinearMethod, check_block_size
from octavo.quantization.naming import is_ignored
from octavo.quantization.params import create_channel_scaled_weights, replace_param


class Fp8LinearMethod(LinearMethod):
    """fp8 weights with per-channel scales; ``serialized``: read from the
    checkpoint, else quantized from the loaded 16/32-bit weight."""

    def __init__(self, serialized: bool) -> None:
        self.serialized = serialized

    def create_weights(self, layer, input_size, output_partition_sizes, params_dtype, bias):
        serialized_dtype = scaled_mm.FP8_DTYPE if self.serialized else None
        create_channel_scaled_weights(layer, input_size, output_partition_sizes, params_dtype, bias, serialized_dtype)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if self.serialized:
            layer.weight_scale.not_in_checkpoint = True
            weight, scale = layer.weight.data, layer.weight_scale.data
        else:
            weight, scale = scaled_mm.quantize_fp8_per_channel(layer.weight.data)
        replace_param(layer, "weight", weight)
        replace_param(layer, "weight_scale", scale.contiguous())

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return layer.ops.fp8_linear(x, layer.weight, layer.weight_scale, layer.bias)


class Fp8Config(QuantizationConfig):
    name = "fp8"

    def __init__(
        self, serialized: bool, ignored_layers: list[str] | None = None, block_size: tuple[int, int] | None = None
    ) -> None:
        self.serialized = serialized
        self.ignored_layers = list(ignored_layers or [])
        self.block_size = block_size

    @classmethod
    def from_hf_config(cls, quant_config: dict[str, Any] | None) -> "Fp8Config":
        if quant_config is None:
            return cls(serialized=False)
        block = quant_config.get("weight_block_size")
        block_size = None if block is None else check_block_size(block, "fp8 weight_block_size")
        scheme = quant_config.get("activation_scheme", "dynamic")
        if scheme not in ("dynamic", "static"):
            raise QuantizationError(f"fp8 activation_scheme {scheme!r} is not supported (dynamic, static)")
        ignored = quant_config.get("ignored_layers") or quant_config.get("modules_to_not_convert") or []
        return cls(serialized=True, ignored_layers=ignored, block_size=block_size)

    def get_linear_method(self, layer: nn.Module, prefix: str) -> LinearMethod:
        if is_ignored(prefix, self.ignored_layers):
            return UnquantizedLinearMethod()
        if self.block_size is not None:
            return Fp8BlockLinearMethod(*self.block_size)
        return Fp8LinearMethod(self.serialized)

    def quantizes_on_load(self) -> bool:
        return not self.serialized

    def checkpoint_weight_names(self) -> list[str]:
        if self.block_size is not None:
            return ["weight_scale_inv"]
        return ["weight_scale", "input_scale"] if self.serialized else []
