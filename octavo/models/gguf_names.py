"""GGUF tensor names and shapes for the Llama family (llama, mistral, qwen2,
qwen3) and its mixture-of-experts members (Mixtral as llama with experts,
qwen2moe, qwen3moe).

llama.cpp names tensors ``token_embd``, ``blk.N.attn_q``, ...; Octavo's
models load Hugging Face names. ``hf_name`` maps one to the other and
``expected_shape`` says, from the config alone, what shape each tensor must
have, so that a file whose tensors disagree with its metadata is refused
before the model is built.

llama.cpp's converter permutes the rows of q and k for llama-arch files
(its rope pairs adjacent dims, HF's "rotate half" pairs dims d and d + D/2):
rows of each head go from ``(2, D/2)`` order to ``(D/2, 2)``. ``unpermute_rows``
undoes that; rows are independent in every ggml type, so it applies to raw
quantized rows as well. qwen2/qwen3 files are not permuted.

Experts are stored stacked, one tensor per projection per layer
(``ffn_gate_exps`` ``[experts, I, H]``, ...); their HF names are templates
with ``{}`` for the expert index (``EXPERT_TENSORS``), filled in when the
tensor is split on loading. A layer without ``ffn_gate_inp`` (the router) is
dense.
"""

from __future__ import annotations

import re

import torch

from octavo.models.config import ModelArchConfig

_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_gate_exps.weight": "mlp.experts.{}.gate_proj.weight",
    "ffn_up_exps.weight": "mlp.experts.{}.up_proj.weight",
    "ffn_down_exps.weight": "mlp.experts.{}.down_proj.weight",
    "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
    "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
}
EXPERT_TENSORS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")
# Linear layers: kept quantized on the device when their type is quantized.
LINEAR_SUFFIXES = (
    "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
    "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
)
# Tensors used while reading the config, not loaded as weights.
CONFIG_TENSORS = ("rope_freqs.weight",)
_BLOCK_NAME = re.compile(r"^blk\.(\d+)\.(.+)$")


def hf_name(gguf_name: str) -> str | None:
    """The HF name of a GGUF tensor, or None if the family has no such tensor."""
    if gguf_name in _GLOBAL:
        return _GLOBAL[gguf_name]
    match = _BLOCK_NAME.match(gguf_name)
    if match and match.group(2) in _BLOCK:
        return f"model.layers.{match.group(1)}.{_BLOCK[match.group(2)]}"
    return None


def block_index(gguf_name: str) -> int | None:
    match = _BLOCK_NAME.match(gguf_name)
    return int(match.group(1)) if match else None


def expected_shape(gguf_name: str, config: ModelArchConfig) -> tuple[int, ...] | None:
    """The torch shape (``[out, in]`` for weights) that ``config`` implies;
    None for a tensor this model has no place for (experts in a dense model)."""
    hidden, head_dim = config.hidden_size, config.head_dim
    q_size, kv_size = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    if gguf_name in ("token_embd.weight", "output.weight"):
        return (config.vocab_size, hidden)
    if gguf_name == "output_norm.weight":
        return (hidden,)
    part = _BLOCK_NAME.match(gguf_name).group(2)
    shapes = {
        "attn_norm.weight": (hidden,),
        "ffn_norm.weight": (hidden,),
        "attn_q.weight": (q_size, hidden),
        "attn_q.bias": (q_size,),
        "attn_k.weight": (kv_size, hidden),
        "attn_k.bias": (kv_size,),
        "attn_v.weight": (kv_size, hidden),
        "attn_v.bias": (kv_size,),
        "attn_output.weight": (hidden, q_size),
        "attn_output.bias": (hidden,),
        "attn_q_norm.weight": (head_dim,),
        "attn_k_norm.weight": (head_dim,),
        "ffn_gate.weight": (config.intermediate_size, hidden),
        "ffn_up.weight": (config.intermediate_size, hidden),
        "ffn_down.weight": (hidden, config.intermediate_size),
    }
    moe = config.moe
    if moe is not None:
        experts, inter, shared = moe.num_experts, moe.intermediate_size, moe.shared_expert_intermediate_size
        shapes.update({
            "ffn_gate_inp.weight": (experts, hidden),
            "ffn_gate_exps.weight": (experts, inter, hidden),
            "ffn_up_exps.weight": (experts, inter, hidden),
            "ffn_down_exps.weight": (experts, hidden, inter),
            "ffn_gate_inp_shexp.weight": (hidden,),  # llama.cpp drops HF's leading 1
            "ffn_gate_shexp.weight": (shared, hidden),
            "ffn_up_shexp.weight": (shared, hidden),
            "ffn_down_shexp.weight": (hidden, shared),
        })
    return shapes.get(part)


def ffn_parts(config: ModelArchConfig, layer: int) -> list[str]:
    """The MLP tensors (names after ``blk.N.``, without ``.weight``) block ``layer`` must have."""
    moe = config.moe
    if moe is None or not moe.sparse_layers[layer]:
        return ["ffn_gate", "ffn_up", "ffn_down"]
    parts = ["ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]
    if moe.shared_expert_intermediate_size:
        parts += ["ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"]
        if moe.shared_expert_gate:
            parts.append("ffn_gate_inp_shexp")
    return parts


def required_names(config: ModelArchConfig, qk_norm: bool) -> list[str]:
    names = ["token_embd.weight", "output_norm.weight"]
    if not config.tie_word_embeddings:
        names.append("output.weight")
    per_block = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm"]
    if qk_norm:
        per_block += ["attn_q_norm", "attn_k_norm"]
    for index in range(config.num_hidden_layers):
        names += [f"blk.{index}.{part}.weight" for part in per_block + ffn_parts(config, index)]
    return names


def permuted_heads(gguf_name: str, config: ModelArchConfig) -> int | None:
    """How many heads' rows llama.cpp permuted in this tensor (None: not permuted)."""
    if ".attn_q." in gguf_name:
        return config.num_attention_heads
    if ".attn_k." in gguf_name:
        return config.num_key_value_heads
    return None


def unpermute_rows(tensor: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation (rows of each head: (D/2, 2) -> (2, D/2))."""
    rows = tensor.shape[0]
    half = rows // num_heads // 2
    rest = tensor.shape[1:]
    return tensor.reshape(num_heads, half, 2, *rest).transpose(1, 2).reshape(rows, *rest).contiguous()
