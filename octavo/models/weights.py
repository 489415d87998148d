"""Checkpoint tensors -> the decoder's parameters.

Names go through three mappings, first match wins: the model's
``checkpoint_renames`` (plain substring replacements), expert weights
(``layers.moe.expert_param_name``: one expert's gate/up/down, or all experts
stacked) and the fused projections (``STACKED_PARAMS``: q/k/v into
``qkv_proj``, gate/up into ``gate_up_proj``), each with the shard id its
parameter's ``weight_loader`` takes. A parameter is complete when every
shard it needs was loaded: the three of ``qkv_proj``, the two of
``gate_up_proj``, the ``required_shard_ids`` an expert parameter lists (its
rank's experts), else the tensor itself; anything missing is a
``ModelLoadError`` naming it. Tensors of no parameter are skipped (another
pipeline stage's layers, rotary caches).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from octavo.errors import ModelLoadError
from octavo.models.layers.attention import kv_scale_param_name
from octavo.models.layers.moe import expert_param_name

STACKED_PARAMS = (
    ("qkv_proj", "q_proj", "q"),
    ("qkv_proj", "k_proj", "k"),
    ("qkv_proj", "v_proj", "v"),
    ("gate_up_proj", "gate_proj", 0),
    ("gate_up_proj", "up_proj", 1),
)
_FUSED_SHARDS = {"qkv_proj": ("q", "k", "v"), "gate_up_proj": (0, 1)}


def param_name(name: str, renames: tuple[tuple[str, str], ...] = ()) -> tuple[str, object]:
    """(parameter name, shard id or None) of a checkpoint tensor."""
    for old, new in renames:
        name = name.replace(old, new)
    expert = expert_param_name(name)
    if expert is not None:
        return expert
    for fused, original, shard_id in STACKED_PARAMS:
        if f".{original}." in name:
            return name.replace(f".{original}.", f".{fused}."), shard_id
    return name, None


def load_decoder_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
    params = dict(model.named_parameters(remove_duplicate=False))
    tied = model.config.tie_word_embeddings
    loaded: set[str] = set()
    for name, tensor in weights:
        if "rotary_emb.inv_freq" in name or (name == "lm_head.weight" and tied):
            continue
        target, shard_id = param_name(name, model.checkpoint_renames)
        param = params.get(target)
        if param is None:
            continue  # another pipeline stage's layer, or an unused tensor
        loader = getattr(param, "weight_loader", None)
        if loader is None:
            if param.shape != tensor.shape:
                raise ModelLoadError(f"{name}: shape {tuple(tensor.shape)} but expected {tuple(param.shape)}")
            param.data.copy_(tensor)
        elif shard_id is None:
            loader(param, tensor)
        else:
            loader(param, tensor, shard_id)
        if isinstance(shard_id, tuple) and shard_id[0] == "all":  # every expert at once
            loaded.update(f"{target}:{s}" for s in param.required_shard_ids(param))
        else:
            loaded.add(target if shard_id is None else f"{target}:{shard_id}")
    check_complete(params, loaded, tied)
    return loaded


def _required(name: str, param: torch.Tensor) -> list[str]:
    listed = getattr(param, "required_shard_ids", None)
    if listed is not None:
        return [f"{name}:{s}" for s in listed(param)]
    fused = next((f for f in _FUSED_SHARDS if f".{f}." in name), None)
    return [f"{name}:{s}" for s in _FUSED_SHARDS[fused]] if fused else [name]


def check_complete(params: dict[str, torch.Tensor], loaded: set[str], tied: bool) -> None:
    for name, param in params.items():
        if getattr(param, "not_in_checkpoint", False):
            continue  # made by a quantization method after loading
        if name == "lm_head.weight" and tied:
            continue
        missing = [r for r in _required(name, param) if r not in loaded]
        if missing:
            raise ModelLoadError(f"the checkpoint has no tensor for {missing[0]}")
