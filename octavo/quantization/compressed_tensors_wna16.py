"""compressed-tensors ``pack-quantized`` weights (W4A16 / W8A16, llm-compressor).

Tensors per linear layer with ``K`` inputs, ``N`` outputs, ``b`` bits
(4 or 8), ``p = 32 / b`` values per int32 and ``G`` groups (``G = 1`` for
the ``channel`` strategy):

* ``weight_packed`` int32 ``[N, K / p]``: input ``k`` in bits ``b * (k % p)``
  of word ``k // p``, stored unsigned (the signed value plus ``2**(b-1)``);
* ``weight_scale`` ``[N, G]``;
* ``weight_zero_point`` int32 ``[N / p, G]`` (asymmetric only): ``p``
  outputs per word, unsigned like the values; symmetric schemes have none
  (their unsigned zero is ``2**(b-1)``);
* ``weight_g_idx`` int32 ``[K]`` (``actorder: group``): the group of each
  input, as GPTQ's ``g_idx``; ``weight_shape`` (unused).

``W[n, k] = (u[n, k] - z[n, g]) * scale[n, g]``, which after loading is
Octavo's grouped layout as is (act-order layers permuted like GPTQ's).
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.kernels.quant import int4 as int4_kernels
from octavo.quantization.gptq import act_order_permutation
from octavo.quantization.int4 import Int4LinearMethod, check_int4_shapes, store_grouped
from octavo.quantization.params import new_param, per_shard_loader


class PackedIntLinearMethod(Int4LinearMethod):
    def __init__(self, bits: int, group_size: int | None, symmetric: bool, act_order: bool) -> None:
        self.bits = bits
        self.group_size = group_size  # None: one group per output channel
        self.symmetric = symmetric
        self.act_order = act_order

    def create_weights(self, layer, input_size, output_partition_sizes, params_dtype, bias):
        split_groups = self.group_size is not None
        group_size = self.group_size if split_groups else input_size
        check_int4_shapes(layer, input_size, output_partition_sizes, group_size, self.bits)
        layer.group_size, layer.weight_bits = group_size, self.bits
        num_out, num_groups, pack = sum(output_partition_sizes), input_size // group_size, 32 // self.bits
        packed = dict(output_dim=0, input_dim=1, packed_dim=1, pack_factor=pack)
        layer.register_parameter("weight_packed", new_param((num_out, input_size // pack), torch.int32, **packed))
        group_dim = {"input_dim": 1} if split_groups else {}
        layer.register_parameter("weight_scale", new_param((num_out, num_groups), params_dtype, output_dim=0, **group_dim))
        if not self.symmetric:
            zero_point = new_param((num_out // pack, num_groups), torch.int32, output_dim=0, packed_dim=0,
                                   pack_factor=pack, **group_dim)
            layer.register_parameter("weight_zero_point", zero_point)
        if self.act_order:
            g_idx = new_param((len(output_partition_sizes), input_size), torch.int32)
            g_idx.weight_loader = per_shard_loader(layer, "weight_g_idx")
            layer.register_parameter("weight_g_idx", g_idx)
        layer.register_parameter("bias", new_param((num_out,), params_dtype, output_dim=0) if bias else None)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        bits = self.bits
        values = int4_kernels.unpack_int4_cols(layer.weight_packed.data, bits=bits)
        scales = layer.weight_scale.data
        if self.symmetric:
            zeros = torch.full(scales.shape, 1 << (bits - 1), dtype=torch.int32, device=scales.device)
        else:
            zeros = int4_kernels.unpack_int4_rows(layer.weight_zero_point.data, bits)
        perm = None
        if self.act_order:
            groups_split = self.group_size is not None
            perm = act_order_permutation(layer, "weight_g_idx", values.shape[1], scales.shape[1], groups_split)
            if perm is not None:
                values = values[:, perm]
        store_grouped(layer, values, scales, zeros, layer.group_size, bits, perm)
