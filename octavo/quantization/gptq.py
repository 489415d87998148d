"""GPTQ checkpoints, 4- and 8-bit (AutoGPTQ / GPTQModel / optimum layout).

Tensors per linear layer with ``K`` inputs, ``N`` outputs, ``G`` groups,
``b`` bits and ``p = 32 / b`` values per int32:

* ``qweight`` int32 ``[K / p, N]``: ``p`` inputs per word, input ``k`` in bits
  ``b * (k % p)`` of row ``k // p``;
* ``qzeros`` int32 ``[G, N / p]``: ``p`` outputs per word, output ``n`` in bits
  ``b * (n % p)``;
* ``scales`` ``[G, N]`` (float16 usually);
* ``g_idx`` int32 ``[K]``: the group of each input. Without act-order it is
  ``k // group_size``; with act-order (``desc_act``) the inputs were
  quantized in a permuted order and each group is a scattered set of inputs.

``W[n, k] = (q[k, n] - z[g_idx[k], n]) * scales[g_idx[k], n]``, where ``z`` is
the unpacked zero **plus one** for the original format (``checkpoint_format``
"gptq", AutoGPTQ's historical convention: it stored ``zero - 1``; a
symmetric 4-bit file stores 7 for a true zero of 8) and the zero as stored
for ``checkpoint_format`` "gptq_v2". Like every GPTQ kernel, the +1 is not
wrapped: a stored 15 reads as 16 (255 as 256 with 8 bits).

After loading, an act-order layer is permuted so that its groups are
contiguous (inputs sorted by ``g_idx``; the activations are permuted the same
way in ``apply``) and the layer becomes Octavo's grouped layout (computed by
the ``int4_linear`` op, or ``int8_grouped_linear`` for 8 bits). Fused q/k/v or
gate/up layers share their input, so GPTQ gives their shards the same
``g_idx``; shards with different ``g_idx`` are refused.
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
from octavo.quantization.params import new_param, per_shard_loader, was_loaded


class GPTQLinearMethod(Int4LinearMethod):
    def __init__(self, config: "GPTQConfig") -> None:
        self.config = config

    def create_weights(self, layer, input_size, output_partition_sizes, params_dtype, bias):
        group_size = self.config.group_size
        # group_size -1: one group over all (global) inputs, never split.
        split_groups = group_size != -1
        group_size = group_size if split_groups else input_size
        bits = self.config.bits
        check_int4_shapes(layer, input_size, output_partition_sizes, group_size, bits)
        num_out, num_groups = sum(output_partition_sizes), input_size // group_size
        layer.group_size, layer.weight_bits = group_size, bits
        pack = 32 // bits
        layer.register_parameter(
            "qweight",
            new_param((input_size // pack, num_out), torch.int32, input_dim=0, output_dim=1, packed_dim=0, pack_factor=pack),
        )
        group_dim = {"input_dim": 0} if split_groups else {}
        layer.register_parameter(
            "qzeros",
            new_param((num_groups, num_out // pack), torch.int32, output_dim=1, packed_dim=1, pack_factor=pack, **group_dim),
        )
        layer.register_parameter("scales", new_param((num_groups, num_out), params_dtype, output_dim=1, **group_dim))
        g_idx = new_param((len(output_partition_sizes), input_size), torch.int32)
        g_idx.weight_loader = per_shard_loader(layer, "g_idx")
        # Without act-order g_idx is implied (k // group_size) and may be absent.
        g_idx.not_in_checkpoint = not self.config.desc_act
        layer.register_parameter("g_idx", g_idx)
        layer.register_parameter("bias", new_param((num_out,), params_dtype, output_dim=0) if bias else None)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        bits = layer.weight_bits
        values = int4_kernels.unpack_int4_rows(layer.qweight.data, bits)
        zeros = int4_kernels.unpack_int4_cols(layer.qzeros.data, bits=bits).to(torch.int32)
        if self.config.zero_point_plus_one:
            zeros = zeros + 1
        groups_split = getattr(layer.qzeros, "input_dim", None) == 0
        perm = act_order_permutation(layer, "g_idx", values.shape[0], layer.scales.shape[0], groups_split)
        if perm is not None:
            values = values[perm]
        store_int4(layer, values, layer.scales.data, zeros, layer.group_size, perm)


def act_order_permutation(
    layer: nn.Module, name: str, num_inputs: int, num_groups: int, groups_split: bool
) -> torch.Tensor | None:
    """The input permutation that makes an act-order layer's groups contiguous
    (``layer.<name>``: the per-shard group index of every input), or None when
    the groups already are (no act-order, or a trivial ``g_idx``)."""
    group_of_input = _group_of_input(layer, name, num_inputs, num_groups, groups_split)
    param = getattr(layer, name)
    trivial = torch.arange(num_inputs, device=param.device) // layer.group_size
    # (On the meta device, when only sizes are measured, there is no g_idx to read.)
    if param.is_meta or torch.equal(group_of_input, trivial):
        return None
    perm = torch.argsort(group_of_input, stable=True)
    if not torch.equal(group_of_input[perm], trivial):
        raise QuantizationError(
            f"{layer.prefix}.{name}: the groups do not all hold {layer.group_size} inputs; "
            "this act-order layout is not supported"
        )
    return perm


def _group_of_input(layer: nn.Module, name: str, num_inputs: int, num_groups: int, groups_split: bool) -> torch.Tensor:
    """The group of every input on this rank, checked for consistency and range."""
    param = getattr(layer, name)
    num_shards = param.shape[0]
    loaded = [was_loaded(layer, name, i) for i in range(num_shards)]
    if not any(loaded) or param.is_meta:
        return torch.arange(num_inputs, device=param.device) // layer.group_size
    g_idx = param.data.to(torch.int64)
    if not all(loaded) or any(not torch.equal(g_idx[0], g_idx[i]) for i in range(1, num_shards)):
        raise QuantizationError(
            f"{layer.prefix}: the fused projections have different {name} (act-order permutations); "
            "Octavo needs one permutation per fused layer"
        )
    groups = g_idx[0]
    # Row-parallel ranks hold a slice of the groups: make indices local.
    row_split = getattr(layer, "input_size_per_partition", None) is not None and layer.tp_size > 1
    if row_split and groups_split:
        groups = groups - layer.tp_rank * num_groups
    if int(groups.min()) < 0 or int(groups.max()) >= num_groups:
        raise QuantizationError(
            f"{layer.prefix}.{name} refers to group {int(groups.max())} (or {int(groups.min())}), "
            f"but the layer has {num_groups} groups on this rank"
        )
    return groups


class GPTQConfig(QuantizationConfig):
    name = "gptq"

    def __init__(
        self, group_size: int, desc_act: bool, zero_point_plus_one: bool, ignored: list[str], bits: int = 4
    ) -> None:
        self.bits = bits
        self.group_size = group_size
        self.desc_act = desc_act
        self.zero_point_plus_one = zero_point_plus_one
        self.ignored = ignored

    @classmethod
    def from_hf_config(cls, quant_config: dict[str, Any] | None) -> "GPTQConfig":
        if quant_config is None:
            raise QuantizationError("gptq needs a GPTQ checkpoint (use --quantization int4 to quantize while loading)")
        bits = int(quant_config.get("bits", 4))
        if bits not in (4, 8):
            raise QuantizationError(f"GPTQ with {bits} bits is not supported (4 and 8 bits are)")
        if quant_config.get("lm_head"):
            raise QuantizationError("GPTQ checkpoints with a quantized lm_head are not supported")
        if quant_config.get("dynamic"):
            raise QuantizationError("GPTQ 'dynamic' per-module overrides are not supported")
        fmt = str(quant_config.get("checkpoint_format", "gptq")).lower()
        if fmt not in ("gptq", "gptq_v2"):
            raise QuantizationError(f"GPTQ checkpoint_format {fmt!r} is not supported (gptq, gptq_v2)")
        group_size = int(quant_config.get("group_size", 128))
        if group_size != -1 and group_size <= 0:
            raise QuantizationError(f"GPTQ group_size {group_size} is invalid")
        ignored = list(quant_config.get("modules_to_not_convert") or [])
        return cls(group_size, bool(quant_config.get("desc_act", False)), fmt == "gptq", ignored, bits)

    def get_linear_method(self, layer: nn.Module, prefix: str) -> LinearMethod:
        if is_ignored(prefix, self.ignored):
            return UnquantizedLinearMethod()
        return GPTQLinearMethod(self)

    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.float16, torch.bfloat16, torch.float32]
