"""What a model's steps read and multiply: its weights as stored, by role.

The floors (``floor.py``) count from this inventory, taken from the model
as Octavo loads it (``build_meta_model``: the real modules and the real
post-load processing, on the ``meta`` device, so the bytes are those of the
loaded weights with their scales, zero points and permutations, for every
quantization method and GGUF type, without reading a weight).

Roles:

- dense linear layers (attention and MLP projections, MoE routers): read
  whole by every step; their *logical* parameters (inputs x outputs) set the
  FLOPs. Kept per matmul kind, since W8A8 layers multiply in fp8 / int8;
- the LM head: read whole by every step; multiplies only the rows that
  produce logits (one per sequence);
- the input embedding: a step reads only the rows it looks up;
- routed experts (MoE): a module with integer attributes ``num_experts`` and
  ``num_experts_per_tok`` holds them; a step reads only the experts it routes
  to, and each token multiplies ``num_experts_per_tok`` of them. Such a
  module may give ``expert_matmul_params`` (inputs x outputs over all its
  experts) when its stored elements are not one per weight (quantized);
- everything else (norms): read whole.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from octavo.models.config import ModelArchConfig


@dataclass
class ExpertGroup:
    """Routed experts of one or more layers that route alike."""

    num_experts: int
    experts_per_token: int
    bytes: int  # every expert of every such layer, as stored
    matmul_params: int  # inputs x outputs, every expert of every such layer
    kind: str


@dataclass
class AttentionShape:
    num_layers: int
    query_width: int  # heads x head_dim: what attention's two products scale with
    kv_bytes_per_token_layer: int  # keys and values of one token in one layer, in the cache's dtype
    kv_dtype: str
    sliding_windows: list[int | None]


@dataclass
class WeightInventory:
    linear_bytes: Counter = field(default_factory=Counter)  # matmul kind -> bytes as stored
    linear_params: Counter = field(default_factory=Counter)  # matmul kind -> inputs x outputs
    lm_head_bytes: int = 0
    lm_head_params: int = 0
    embedding_row_bytes: int = 0
    other_bytes: int = 0
    experts: list[ExpertGroup] = field(default_factory=list)
    model_kind: str = "bfloat16"
    attention: AttentionShape | None = None

    @property
    def dense_bytes(self) -> int:
        """What every step reads whole: dense linears, LM head, norms."""
        return sum(self.linear_bytes.values()) + self.lm_head_bytes + self.other_bytes

    def matmul_kinds(self) -> list[str]:
        kinds = [self.model_kind, *self.linear_params, *(group.kind for group in self.experts)]
        return list(dict.fromkeys(kinds))


def _own_params(module: nn.Module, seen: set[int], recurse: bool = False) -> list[torch.Tensor]:
    own = [p for p in module.parameters(recurse=recurse) if id(p) not in seen]
    seen.update(id(p) for p in own)
    return own


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _linear_params(module: nn.Module) -> int:
    inputs = getattr(module, "input_size_per_partition", module.input_size)
    return inputs * sum(module.output_partition_sizes)


def _expert_group(module: nn.Module, seen: set[int], kind: str) -> ExpertGroup:
    params = _own_params(module, seen, recurse=True)
    matmul_params = getattr(module, "expert_matmul_params", None)
    if matmul_params is None:
        matmul_params = sum(p.numel() for p in params if p.dtype.is_floating_point and p.dim() >= 2)
    return ExpertGroup(int(module.num_experts), int(module.num_experts_per_tok), _bytes(params), int(matmul_params), kind)


def _merge(groups: list[ExpertGroup]) -> list[ExpertGroup]:
    merged: dict[tuple, ExpertGroup] = {}
    for group in groups:
        key = (group.num_experts, group.experts_per_token, group.kind)
        if key in merged:
            merged[key].bytes += group.bytes
            merged[key].matmul_params += group.matmul_params
        else:
            merged[key] = group
    return list(merged.values())


def weight_inventory(model: nn.Module, linear_kind: Callable[[nn.Module], str], model_kind: str) -> WeightInventory:
    """Sort every parameter of ``model`` into its role (``linear_kind``: the
    matmul kind of a linear layer)."""
    from octavo.models.layers.attention import KV_SCALE_NAMES
    from octavo.models.layers.embedding import ParallelLMHead, VocabParallelEmbedding
    from octavo.models.layers.linear import LinearBase

    inventory, seen, groups = WeightInventory(model_kind=model_kind), set(), []
    # Containers first, so that their linears count as experts, not as dense layers.
    for module in model.modules():
        if isinstance(getattr(module, "num_experts", None), int) and isinstance(getattr(module, "num_experts_per_tok", None), int):
            groups.append(_expert_group(module, seen, model_kind))
    # The LM head before the embedding: with tied weights the table is the head's.
    for module in model.modules():
        if isinstance(module, ParallelLMHead):
            inventory.lm_head_bytes += _bytes(_own_params(module, seen))
            inventory.lm_head_params += module.weight.numel()
    for module in model.modules():
        if isinstance(module, LinearBase):
            own = _own_params(module, seen)
            if own:
                kind = linear_kind(module)
                inventory.linear_bytes[kind] += _bytes(own)
                inventory.linear_params[kind] += _linear_params(module)
        elif isinstance(module, VocabParallelEmbedding) and not isinstance(module, ParallelLMHead):
            _own_params(module, seen)
            inventory.embedding_row_bytes = module.weight.shape[1] * module.weight.element_size()
    # The attention layers' KV-cache scales go to the kernels as scalars once
    # loaded (models/layers/attention.py); no step reads them from memory.
    kv_scales = [p for name, p in model.named_parameters() if name.rsplit(".", 1)[-1] in KV_SCALE_NAMES]
    seen.update(id(p) for p in kv_scales)
    inventory.other_bytes = _bytes(_own_params(model, seen, recurse=True))
    inventory.experts = _merge(groups)
    return inventory


def attention_shape(arch: ModelArchConfig, kv_dtype: torch.dtype) -> AttentionShape:
    element = torch.empty((), dtype=kv_dtype).element_size()
    return AttentionShape(
        num_layers=arch.num_hidden_layers,
        query_width=arch.num_attention_heads * arch.head_dim,
        kv_bytes_per_token_layer=2 * arch.num_key_value_heads * arch.head_dim * element,
        kv_dtype=str(kv_dtype).removeprefix("torch."),
        sliding_windows=list(arch.sliding_windows),
    )


def w8a8_kind(device: torch.device) -> Callable[[nn.Module], str | None]:
    """The matmul kind of a W8A8 linear layer on ``device`` (None: it
    multiplies in the activations' dtype), as its method decides after loading."""
    from octavo.kernels.quant import scaled_mm
    from octavo.quantization.fp8 import Fp8LinearMethod
    from octavo.quantization.int8 import Int8LinearMethod

    def kind(layer: nn.Module) -> str | None:
        method = layer.quant_method
        out_features, in_features = sum(layer.output_partition_sizes), getattr(layer, "input_size_per_partition", layer.input_size)
        if isinstance(method, Fp8LinearMethod) and scaled_mm.fp8_w8a8_supported(device):
            return "fp8" if device.type != "cuda" or (out_features % 16 == 0 and in_features % 16 == 0) else None
        if isinstance(method, Int8LinearMethod) and method.w8a8 and scaled_mm.int8_w8a8_supported(device):
            return "int8" if device.type != "cuda" or (out_features % 8 == 0 and in_features % 8 == 0) else None
        return None

    return kind


def measure_inventory(model_path: str, quantization: str | None, dtype: torch.dtype, kv_dtype: torch.dtype, device: torch.device) -> WeightInventory:
    """The inventory of ``model_path`` as Octavo loads it on ``device``."""
    from octavo.quantization.memory import build_meta_model

    model_kind = str(dtype).removeprefix("torch.")
    model, arch = build_meta_model(model_path, quantization, model_kind)
    w8a8 = w8a8_kind(device)
    inventory = weight_inventory(model, lambda layer: w8a8(layer) or model_kind, model_kind)
    inventory.attention = attention_shape(arch, kv_dtype)
    return inventory
