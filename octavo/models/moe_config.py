"""The mixture-of-experts part of a checkpoint's config, per family.

Each family names the same things differently (Mixtral's
``num_local_experts``, Qwen's ``num_experts`` and ``moe_intermediate_size``,
DeepSeek's ``n_routed_experts``, ...); ``parse_moe_config`` reads them into
one ``MoEConfig`` keyed by ``model_type``, or returns None for a dense model.
Which layers are sparse follows Hugging Face: Qwen2-MoE and Qwen3-MoE skip
the layers listed in ``mlp_only_layers`` and those that
``decoder_sparse_step`` steps over; DeepSeek (and GLM-4.5) keeps its first
``first_k_dense_replace`` layers dense; the other families are sparse in
every layer.

Routing (``layers/moe.py``): softmax over the experts and the top ``k``
(most families); DeepSeek V2 may first keep the ``topk_group`` best of
``n_group`` expert groups (by their best expert) and scales the weights by
``routed_scaling_factor``; DeepSeek V3 scores with a sigmoid, chooses with a
learned correction bias added, ranks groups by the sum of their two best
experts, and renormalises before scaling.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from octavo.errors import ModelLoadError, UnsupportedModelError


@dataclass(frozen=True)
class MoEConfig:
    num_experts: int
    top_k: int
    # Each expert's MLP width (gate and up project to it, down from it).
    intermediate_size: int
    # Divide the top-k routing weights by their sum (Mixtral always; Qwen
    # and OLMoE per ``norm_topk_prob``).
    renormalize: bool
    # Per layer: True for a sparse (experts) layer, False for a dense MLP.
    sparse_layers: tuple[bool, ...]
    scoring: str = "softmax"
    # A shared expert every token goes through (Qwen2-MoE), 0 for none, and
    # whether a sigmoid gate scales its output per token.
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = False
    # DeepSeek's routing: expert groups, the weights' scale, the correction
    # bias (V3), and the router computed in float32.
    num_groups: int = 1
    topk_groups: int = 1
    group_score: str = "max"  # "max" (V2) or "top2_sum" (V3)
    routed_scaling_factor: float = 1.0
    correction_bias: bool = False

    @property
    def plain_routing(self) -> bool:
        """Softmax, top-k, optional renormalisation: nothing more."""
        return self.scoring == "softmax" and self.num_groups == 1 and self.routed_scaling_factor == 1.0 and not self.correction_bias

    @property
    def num_sparse_layers(self) -> int:
        return sum(self.sparse_layers)


def _qwen_sparse_layers(raw: dict[str, Any], num_layers: int) -> tuple[bool, ...]:
    only_dense = set(raw.get("mlp_only_layers") or [])
    step = int(raw.get("decoder_sparse_step") or 1)
    return tuple(i not in only_dense and (i + 1) % step == 0 for i in range(num_layers))


def _num_experts(raw: dict[str, Any]) -> int:
    # transformers 5 saves Qwen3-MoE's num_experts under Mixtral's name.
    return int(raw["num_experts"] if "num_experts" in raw else raw["num_local_experts"])


def _mixtral(raw: dict[str, Any], num_layers: int) -> MoEConfig:
    return MoEConfig(
        num_experts=_num_experts(raw),
        top_k=int(raw["num_experts_per_tok"]),
        intermediate_size=int(raw["intermediate_size"]),
        renormalize=True,
        sparse_layers=(True,) * num_layers,
    )


def _qwen_moe(raw: dict[str, Any], num_layers: int) -> MoEConfig:
    shared = int(raw.get("shared_expert_intermediate_size") or 0)
    return MoEConfig(
        num_experts=_num_experts(raw),
        top_k=int(raw["num_experts_per_tok"]),
        intermediate_size=int(raw["moe_intermediate_size"]),
        renormalize=bool(raw.get("norm_topk_prob", False)),
        sparse_layers=_qwen_sparse_layers(raw, num_layers),
        shared_expert_intermediate_size=shared,
        shared_expert_gate=shared > 0,
    )


def _olmoe(raw: dict[str, Any], num_layers: int) -> MoEConfig:
    return MoEConfig(
        num_experts=_num_experts(raw),
        top_k=int(raw["num_experts_per_tok"]),
        intermediate_size=int(raw["intermediate_size"]),
        renormalize=bool(raw.get("norm_topk_prob", False)),
        sparse_layers=(True,) * num_layers,
    )


def _granitemoe(raw: dict[str, Any], num_layers: int) -> MoEConfig:
    """Granite MoE: Mixtral's routing (a softmax over the top-k logits is the
    renormalised top-k of the softmax); the shared variant's MLP, which every
    token goes through unscaled (no sigmoid gate)."""
    shared = int(raw.get("shared_intermediate_size") or 0)
    return dataclasses.replace(_mixtral(raw, num_layers), shared_expert_intermediate_size=shared)


def _deepseek(raw: dict[str, Any], num_layers: int) -> MoEConfig:
    v3 = raw.get("model_type") == "deepseek_v3"
    method = raw.get("topk_method") or ("noaux_tc" if v3 else "greedy")
    if method not in ("greedy", "group_limited_greedy", "noaux_tc"):
        raise UnsupportedModelError(f"config.json: topk_method {method!r} is not supported (greedy, group_limited_greedy, noaux_tc are)")
    grouped = method != "greedy"
    first_dense, frequency = int(raw.get("first_k_dense_replace") or 0), int(raw.get("moe_layer_freq") or 1)
    inter = int(raw["moe_intermediate_size"])
    return MoEConfig(
        num_experts=int(raw["n_routed_experts"]),
        top_k=int(raw["num_experts_per_tok"]),
        intermediate_size=inter,
        renormalize=bool(raw.get("norm_topk_prob", v3)),
        sparse_layers=tuple(i >= first_dense and i % frequency == 0 for i in range(num_layers)),
        scoring="sigmoid" if v3 else "softmax",
        shared_expert_intermediate_size=inter * int(raw.get("n_shared_experts") or 0),
        num_groups=int(raw.get("n_group") or 1) if grouped else 1,
        topk_groups=int(raw.get("topk_group") or 1) if grouped else 1,
        group_score="top2_sum" if v3 else "max",
        routed_scaling_factor=float(raw.get("routed_scaling_factor") or 1.0),
        correction_bias=method == "noaux_tc",
    )


def _glm4_moe(raw: dict[str, Any], num_layers: int) -> MoEConfig:
    """GLM-4.5: DeepSeek V3's routing (sigmoid, a correction bias, grouped
    top-k) and shared experts under the same names, its first
    ``first_k_dense_replace`` layers dense."""
    return _deepseek({**raw, "model_type": "deepseek_v3", "topk_method": "noaux_tc"}, num_layers)


def _ernie4_5_moe(raw: dict[str, Any], num_layers: int) -> MoEConfig:
    """ERNIE 4.5 MoE: a softmax router whose choice adds a correction bias
    (the weights are the unbiased scores, renormalised), shared experts, and
    sparse layers every ``moe_layer_interval`` from ``moe_layer_start_index``
    to ``moe_layer_end_index``."""
    start, interval = int(raw.get("moe_layer_start_index") or 0), int(raw.get("moe_layer_interval") or 1)
    end = raw.get("moe_layer_end_index")
    end = num_layers - 1 if end is None or int(end) < 0 else int(end)
    inter = int(raw["moe_intermediate_size"])
    return MoEConfig(  # ERNIE's own names (moe_num_experts, moe_k), or transformers' aliases
        num_experts=int(raw["moe_num_experts"]) if "moe_num_experts" in raw else _num_experts(raw),
        top_k=int(raw["moe_k"] if "moe_k" in raw else raw["num_experts_per_tok"]),
        intermediate_size=inter,
        renormalize=True,
        sparse_layers=tuple((i + 1) % interval == 0 and start <= i <= end for i in range(num_layers)),
        shared_expert_intermediate_size=inter * int(raw.get("moe_num_shared_experts") or 0),
        correction_bias=True,
    )


def _qwen3_vl_moe(raw: dict[str, Any], num_layers: int) -> MoEConfig:
    """Qwen3-VL's MoE language model: Qwen3-MoE's, its top-k always renormalised."""
    return dataclasses.replace(_qwen_moe(raw, num_layers), renormalize=True)


_PARSERS = {
    "mixtral": _mixtral, "qwen2_moe": _qwen_moe, "qwen3_moe": _qwen_moe, "olmoe": _olmoe,
    # gpt-oss: a softmax over the top-k logits is the top-k of the softmax, renormalised.
    "gpt_oss": _mixtral,
    "granitemoe": _granitemoe, "granitemoeshared": _granitemoe,
    "deepseek_v2": _deepseek, "deepseek_v3": _deepseek, "glm4_moe": _glm4_moe,
    "dots1": _glm4_moe,  # dots.llm1: the same routing under the same names
    "ernie4_5_moe": _ernie4_5_moe,
    "qwen3_vl_moe_text": _qwen3_vl_moe,
}


def parse_moe_config(raw: dict[str, Any], num_layers: int) -> MoEConfig | None:
    """The MoE settings of a ``config.json`` (None for a dense model)."""
    parser = _PARSERS.get(raw.get("model_type", ""))
    if parser is None:
        return None
    moe = parser(raw, num_layers)
    if moe.num_experts < 1 or not 1 <= moe.top_k <= moe.num_experts:
        raise ModelLoadError(
            f"config.json: num_experts_per_tok={moe.top_k} must be between 1 and the {moe.num_experts} experts"
        )
    if moe.intermediate_size < 1:
        raise ModelLoadError(f"config.json: the experts' intermediate size {moe.intermediate_size} is not positive")
    if raw.get("scoring_func", moe.scoring) != moe.scoring:
        raise UnsupportedModelError(f"config.json: scoring_func {raw['scoring_func']!r} is not supported ({moe.scoring} is)")
    if moe.num_experts % moe.num_groups or moe.topk_groups > moe.num_groups:
        raise ModelLoadError(f"config.json: {moe.num_experts} experts cannot form {moe.num_groups} groups of which {moe.topk_groups} are kept")
    return moe
