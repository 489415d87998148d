"""compressed-tensors checkpoints (llm-compressor): 8-bit weights, and packed 4/8-bit W*A16.

``quantization_config``: ``quant_method: "compressed-tensors"``, a ``format``
(global or per group), ``config_groups`` (each with ``targets``, a
``weights`` scheme and an optional ``input_activations`` scheme) and an
``ignore`` list. Supported groups:

* fp8 weights (``type: float, num_bits: 8``, strategy ``tensor`` or
  ``channel``) in the ``float-quantized`` or ``naive-quantized`` format:
  ``weight`` float8_e4m3fn + ``weight_scale`` -> the fp8 method;
* int8 weights (``type: int, num_bits: 8``, symmetric, strategy ``tensor``
  or ``channel``) in the ``int-quantized`` or ``naive-quantized`` format:
  ``weight`` int8 + ``weight_scale`` -> W8A8 if the group quantizes input
  activations, weight-only otherwise;
* fp8 weights with ``strategy: block`` (``block_structure [bn, bk]``):
  the block-scaled fp8 method;
* 4- or 8-bit integer weights in the ``pack-quantized`` format, strategy
  ``group`` or ``channel``, symmetric or not, ``actorder`` ``group`` /
  ``weight`` / none, and no input quantization (W4A16 / W8A16):
  ``compressed_tensors_wna16``, Octavo's grouped-integer kernels.

Activations are quantized per token, dynamically, whatever the checkpoint's
input scheme (a static ``input_scale`` is not needed and not read). Other
schemes (other bit widths, asymmetric 8-bit, 4-bit with quantized
activations, sparse) are refused with the scheme named.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from octavo.errors import QuantizationError
from octavo.quantization.base import LinearMethod, QuantizationConfig, UnquantizedLinearMethod
from octavo.quantization.compressed_tensors_wna16 import PackedIntLinearMethod
from octavo.quantization.fp8 import Fp8LinearMethod
from octavo.quantization.fp8_block import Fp8BlockLinearMethod, check_block_size
from octavo.quantization.int8 import Int8LinearMethod
from octavo.quantization.naming import checkpoint_names, is_ignored, name_matches

_FORMATS = {"float": ("float-quantized", "naive-quantized"), "int": ("int-quantized", "naive-quantized")}


@dataclass
class _Group:
    name: str
    targets: list[str]
    weight_type: str  # "float" (fp8), "int" (int8) or "packed" (4/8-bit grouped integers)
    w8a8: bool
    bits: int = 8
    group_size: int | None = None  # packed: None = per channel
    symmetric: bool = True
    act_order: bool = False
    block_size: tuple[int, int] | None = None  # fp8 block strategy

    def method(self) -> LinearMethod:
        if self.weight_type == "packed":
            return PackedIntLinearMethod(self.bits, self.group_size, self.symmetric, self.act_order)
        if self.block_size is not None:
            return Fp8BlockLinearMethod(*self.block_size, scale_name="weight_scale")
        if self.weight_type == "float":
            return Fp8LinearMethod(serialized=True)
        return Int8LinearMethod(serialized=True, w8a8=self.w8a8)

    def matches(self, prefix: str) -> bool:
        for target in self.targets:
            if target in ("Linear", "nn.Linear", "torch.nn.Linear"):
                return True
            if any(name_matches(name, target) for name in checkpoint_names(prefix)):
                return True
        return False


def _parse_packed(name: str, weights: dict[str, Any], described: str, targets: list[str], quantized_inputs: bool) -> _Group:
    bits, strategy = weights.get("num_bits"), weights.get("strategy", "group")
    symmetric = bool(weights.get("symmetric", True))
    if weights.get("type") != "int" or bits not in (4, 8):
        raise QuantizationError(f"compressed-tensors {described}: pack-quantized supports 4- and 8-bit int weights")
    if strategy not in ("group", "channel"):
        raise QuantizationError(f"compressed-tensors {described}: pack-quantized needs the group or channel strategy")
    if quantized_inputs:
        raise QuantizationError(f"compressed-tensors {described}: quantized activations with packed weights are not supported")
    if bits == 8 and not symmetric:
        raise QuantizationError(f"compressed-tensors {described}: asymmetric 8-bit packed weights are not supported")
    group_size = int(weights.get("group_size") or 0) if strategy == "group" else None
    if group_size is not None and group_size <= 0:
        raise QuantizationError(f"compressed-tensors {described}: group_size {weights.get('group_size')!r} is invalid")
    act_order = weights.get("actorder") == "group"
    return _Group(name, targets, "packed", False, bits, group_size, symmetric, act_order)


def _parse_group(name: str, group: dict[str, Any], default_format: str | None) -> _Group:
    weights = group.get("weights") or {}
    fmt = group.get("format") or default_format
    kind, bits = weights.get("type"), weights.get("num_bits")
    strategy = weights.get("strategy", "tensor")
    described = f"config group {name!r} (weights {kind}{bits}, strategy {strategy}, format {fmt})"
    targets = group.get("targets") or []
    if not targets:
        raise QuantizationError(f"compressed-tensors config group {name!r} has no targets")
    if fmt == "pack-quantized":
        return _parse_packed(name, weights, described, list(targets), group.get("input_activations") is not None)
    if bits != 8 or kind not in _FORMATS or fmt not in _FORMATS[kind]:
        raise QuantizationError(
            f"compressed-tensors {described} is not supported (8-bit float or int weights, "
            "or pack-quantized 4/8-bit int weights are)"
        )
    if not weights.get("symmetric", True):
        raise QuantizationError(f"compressed-tensors {described}: asymmetric weights are not supported")
    if strategy == "block" and kind == "float":
        block = check_block_size(weights.get("block_structure"), f"compressed-tensors {described}")
        return _Group(name, list(targets), kind, w8a8=True, block_size=block)
    if strategy not in ("tensor", "channel"):
        raise QuantizationError(
            f"compressed-tensors {described}: only per-tensor, per-channel (and fp8 block) weight scales are supported"
        )
    return _Group(name, list(targets), kind, w8a8=group.get("input_activations") is not None)


class CompressedTensorsConfig(QuantizationConfig):
    name = "compressed-tensors"

    def __init__(self, groups: list[_Group], ignore: list[str]) -> None:
        self.groups = groups
        self.ignore = ignore

    @classmethod
    def from_hf_config(cls, quant_config: dict[str, Any] | None) -> "CompressedTensorsConfig":
        if quant_config is None:
            raise QuantizationError("compressed-tensors needs a compressed-tensors checkpoint")
        groups = quant_config.get("config_groups") or {}
        if not isinstance(groups, dict) or not groups:
            raise QuantizationError("compressed-tensors quantization_config has no config_groups")
        if quant_config.get("sparsity_config"):
            raise QuantizationError("compressed-tensors sparse checkpoints (sparsity_config) are not supported")
        default_format = quant_config.get("format")
        parsed = [_parse_group(name, group or {}, default_format) for name, group in groups.items()]
        return cls(parsed, list(quant_config.get("ignore") or []))

    def get_linear_method(self, layer: nn.Module, prefix: str) -> LinearMethod:
        if is_ignored(prefix, self.ignore):
            return UnquantizedLinearMethod()
        for group in self.groups:
            if group.matches(prefix):
                return group.method()
        return UnquantizedLinearMethod()
