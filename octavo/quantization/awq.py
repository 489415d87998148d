"""AWQ int4 checkpoints (AutoAWQ "gemm" layout).

Tensors per linear layer with ``K`` inputs, ``N`` outputs, ``G = K / group_size``:

* ``qweight`` int32 ``[K, N / 8]``: 8 outputs per word, packed along the
  output dimension in AWQ's interleaved order -- nibble ``i`` (bits
  ``4 * i``) holds output ``8 * c + (0, 2, 4, 6, 1, 3, 5, 7)[i]`` of word
  column ``c``;
* ``qzeros`` int32 ``[G, N / 8]``: the zero points, packed the same way;
* ``scales`` ``[G, N]``.

``W[n, k] = (q[k, n] - z[k // group_size, n]) * scales[k // group_size, n]``
(the zero as stored: AWQ has no +1 convention and no act-order). After
loading the layer is repacked into Octavo's grouped layout (``int4_linear``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from octavo.errors import QuantizationError
from octavo.kernels.quant import int4 as int4_kernels
from octavo.quantization.base import LinearMethod, QuantizationConfig, UnquantizedLinearMethod
from octavo.quantization.int4 import Int4LinearMethod, check_int4_shapes, store_int4
from octavo.quantization.naming import is_ignored
from octavo.quantization.params import new_param


class AWQLinearMethod(Int4LinearMethod):
    def __init__(self, group_size: int) -> None:
        self.group_size = group_size

    def create_weights(self, layer, input_size, output_partition_sizes, params_dtype, bias):
        check_int4_shapes(layer, input_size, output_partition_sizes, self.group_size)
        num_out, num_groups = sum(output_partition_sizes), input_size // self.group_size
        pack = int4_kernels.PACK_FACTOR
        layer.group_size, layer.weight_bits = self.group_size, 4
        packed = dict(input_dim=0, output_dim=1, packed_dim=1, pack_factor=pack)
        layer.register_parameter("qweight", new_param((input_size, num_out // pack), torch.int32, **packed))
        layer.register_parameter("qzeros", new_param((num_groups, num_out // pack), torch.int32, **packed))
        layer.register_parameter("scales", new_param((num_groups, num_out), params_dtype, input_dim=0, output_dim=1))
        layer.register_parameter("bias", new_param((num_out,), params_dtype, output_dim=0) if bias else None)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        order = int4_kernels.AWQ_ORDER
        values = int4_kernels.unpack_int4_cols(layer.qweight.data, order)
        zeros = int4_kernels.unpack_int4_cols(layer.qzeros.data, order)
        store_int4(layer, values, layer.scales.data, zeros, layer.group_size)


class AWQConfig(QuantizationConfig):
    name = "awq"

    def __init__(self, group_size: int, ignored: list[str]) -> None:
        self.group_size = group_size
        self.ignored = ignored

    @classmethod
    def from_hf_config(cls, quant_config: dict[str, Any] | None) -> "AWQConfig":
        if quant_config is None:
            raise QuantizationError("awq needs an AWQ checkpoint (use --quantization int4 to quantize while loading)")
        bits = int(quant_config.get("bits", quant_config.get("w_bit", 4)))
        if bits != 4:
            raise QuantizationError(f"AWQ with {bits} bits is not supported (4 bits is)")
        version = str(quant_config.get("version", "gemm")).lower()
        if version != "gemm":
            raise QuantizationError(f"AWQ version {version!r} is not supported (gemm is)")
        if not quant_config.get("zero_point", True):
            raise QuantizationError("AWQ without zero points (zero_point: false) is not supported")
        group_size = int(quant_config.get("group_size", quant_config.get("q_group_size", 128)))
        if group_size <= 0:
            raise QuantizationError(f"AWQ group_size {group_size} is invalid")
        return cls(group_size, list(quant_config.get("modules_to_not_convert") or []))

    def get_linear_method(self, layer: nn.Module, prefix: str) -> LinearMethod:
        if is_ignored(prefix, self.ignored):
            return UnquantizedLinearMethod()
        return AWQLinearMethod(self.group_size)

    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.float16, torch.bfloat16, torch.float32]
