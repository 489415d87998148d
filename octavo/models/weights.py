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
pipeline stage's layers, rotary caches). The copying and the completeness
check are ``weight_loading``'s, shared with the encoder models.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from octavo.models.layers.attention import kv_scale_param_name
from octavo.models.layers.moe import expert_param_name
from octavo.models.weight_loading import check_all_loaded, load_named_tensors

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


def load_decoder_weights(
    model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]], other_names: Callable[[str], str | None] | None = None,
) -> set[str]:
    """The decoder's tensors by their checkpoint names; ``other_names`` maps the names of
    a model's other parts (a vision tower, a projector) to their parameters (None: not one of them)."""
    tied = model.config.tie_word_embeddings

    def rename(name: str) -> tuple[str, object] | None:
        other = other_names(name) if other_names is not None else None
        if other is not None:
            return other, None
        if "rotary_emb.inv_freq" in name or (name == "lm_head.weight" and tied):
            return None
        return param_name(kv_scale_param_name(name), model.checkpoint_renames)

    loaded = load_named_tensors(model, weights, rename)
    check_all_loaded(model, loaded, _FUSED_SHARDS, skip=lambda name: tied and name == "lm_head.weight")
    return loaded
