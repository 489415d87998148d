"""Loading a model straight from a ``.gguf`` file (llama.cpp's format).

* ``gguf_arch_config``: the config from the GGUF metadata (llama, mistral,
  qwen2 and qwen3 families; Mixtral (llama with ``expert_count``), qwen2moe
  and qwen3moe), after checking every tensor against it: known name, shape
  implied by the metadata, supported ggml type. Nothing is allocated for
  the model before these checks pass.
* ``iterate_gguf_tensors``: ``(hf_name, tensor)`` pairs for the model's
  ``load_weights``. Linear layers whose weights are quantized stay quantized
  (``<module>.qweight`` raw rows, for the ``gguf`` quantization method); all
  other tensors are dequantized by ``octavo.kernels.quant.gguf_dequant`` to
  float32 (then cast to the model dtype by the parameters' loaders). That
  includes the stacked expert tensors (split into one tensor per expert):
  the experts run unquantized, in the model dtype.
* ``gguf_tokenizer``: a fast HF tokenizer built from the metadata by
  transformers' GGUF converter (vocabulary, merges, special tokens, chat
  template).

Which linear modules stay quantized is decided per fused group (q/k/v,
gate/up): if any shard is quantized, all of the group's shards are kept as
raw rows, since one fused layer holds them all.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from octavo.errors import ModelLoadError, UnsupportedModelError
from octavo.kernels.quant.gguf_dequant import GGML_TYPES, dequantize_gguf
from octavo.models import gguf_names
from octavo.models.config import ModelArchConfig, parse_arch_config
from octavo.models.gguf_file import GGUFFile, open_gguf

logger = logging.getLogger(__name__)

# GGUF architecture -> (HF architecture, model_type, q/k permuted by llama.cpp, q/k norms)
ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama", True, False),
    "mistral": ("MistralForCausalLM", "mistral", True, False),
    "qwen2": ("Qwen2ForCausalLM", "qwen2", False, False),
    "qwen3": ("Qwen3ForCausalLM", "qwen3", False, True),
    "qwen2moe": ("Qwen2MoeForCausalLM", "qwen2_moe", False, False),
    "qwen3moe": ("Qwen3MoeForCausalLM", "qwen3_moe", False, True),
}
_FUSED_GROUPS = (
    ("attn_q", "attn_k", "attn_v"), ("attn_output",), ("ffn_gate", "ffn_up"), ("ffn_down",),
    ("ffn_gate_shexp", "ffn_up_shexp"), ("ffn_down_shexp",),
)
_MAX_DIM = 1 << 20
_MAX_CONTEXT = 1 << 24
# llama.cpp's general.file_type: all F32, mostly F16, mostly BF16.
_FILE_TYPE_DTYPES = {0: "float32", 1: "float16", 32: "bfloat16"}


def _int_field(gguf: GGUFFile, key: str, default: int | None = None, maximum: int = _MAX_DIM) -> int:
    value = gguf.field(key)
    if value is None:
        if default is None:
            raise ModelLoadError(f"{gguf.path.name}: metadata field {key!r} is missing")
        return default
    if isinstance(value, list):  # per-layer values: fine when all equal
        if not value or any(v != value[0] for v in value):
            raise UnsupportedModelError(f"{gguf.path.name}: per-layer values of {key!r} are not supported")
        value = value[0]
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= maximum:
        raise ModelLoadError(f"{gguf.path.name}: metadata field {key!r} = {value!r} is out of range (1..{maximum})")
    return value


def _float_field(gguf: GGUFFile, key: str, default: float) -> float:
    value = gguf.field(key, default)
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ModelLoadError(f"{gguf.path.name}: metadata field {key!r} = {value!r} is not a positive number")
    return float(value)


def _architecture(gguf: GGUFFile) -> str:
    arch = gguf.field("general.architecture")
    if not isinstance(arch, str):
        raise ModelLoadError(f"{gguf.path.name}: metadata field 'general.architecture' is missing")
    if arch not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"{gguf.path.name}: GGUF architecture {arch!r} is not supported ({', '.join(ARCHITECTURES)} are)"
        )
    return arch


def _rope_scaling(gguf: GGUFFile, arch: str, head_dim: int, theta: float) -> dict[str, Any] | None:
    kind = gguf.field(f"{arch}.rope.scaling.type")
    if "rope_freqs.weight" in gguf.tensors:
        return _llama3_from_rope_freqs(gguf, arch, head_dim, theta)
    if kind in (None, "none"):
        return None
    factor = _float_field(gguf, f"{arch}.rope.scaling.factor", 1.0)
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn":
        original = _int_field(gguf, f"{arch}.rope.scaling.original_context_length", maximum=_MAX_CONTEXT)
        return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original}
    raise UnsupportedModelError(f"{gguf.path.name}: rope scaling type {kind!r} is not supported (linear, yarn)")


def _llama3_from_rope_freqs(gguf: GGUFFile, arch: str, head_dim: int, theta: float) -> dict[str, Any]:
    """llama.cpp stores Llama 3.1's rope scaling as per-dim frequency divisors
    (``rope_freqs``); recover the llama3 parameters and check they reproduce it."""
    from octavo.models.layers.rotary import compute_inv_freq

    info = gguf.tensors["rope_freqs.weight"]
    if info.shape != (head_dim // 2,) or GGML_TYPES.get(info.type_id) is None:
        raise ModelLoadError(f"{gguf.path.name}: tensor 'rope_freqs.weight' should be F32 [{head_dim // 2}]")
    factors = _read_dequantized(gguf, "rope_freqs.weight")
    original = _int_field(gguf, f"{arch}.rope.scaling.original_context_length", default=8192, maximum=_MAX_CONTEXT)
    params = {
        "rope_type": "llama3",
        "factor": float(factors.max()),
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": original,
    }
    base, _ = compute_inv_freq(head_dim, theta, None, original)
    scaled, _ = compute_inv_freq(head_dim, theta, params, original)
    if not torch.allclose(base / scaled, factors, rtol=1e-3):
        raise UnsupportedModelError(
            f"{gguf.path.name}: tensor 'rope_freqs.weight' holds frequency factors that are not Llama 3 rope scaling"
        )
    return params


def _moe_config(gguf: GGUFFile, arch: str, num_layers: int) -> dict[str, Any]:
    """HF config fields of the experts (empty for a dense file)."""
    key = lambda suffix: f"{arch}.{suffix}"  # noqa: E731
    if not gguf.field(key("expert_count")):
        return {}
    experts = _int_field(gguf, key("expert_count"), maximum=4096)
    fields = {"num_experts_per_tok": _int_field(gguf, key("expert_used_count"), maximum=experts)}
    expert_size = _int_field(gguf, key("expert_feed_forward_length"), default=0) or None
    # llama.cpp renormalises the top-k weights for Mixtral and Qwen3-MoE, not for Qwen2-MoE.
    norm = gguf.field(key("expert_weights_norm"), arch != "qwen2moe")
    if arch in ("llama", "mistral"):
        return {**fields, "num_local_experts": experts, "intermediate_size": expert_size or _int_field(gguf, key("feed_forward_length"))}
    fields.update(num_experts=experts, moe_intermediate_size=expert_size or _int_field(gguf, key("feed_forward_length")))
    fields.update(norm_topk_prob=bool(norm), decoder_sparse_step=1)
    fields["mlp_only_layers"] = [i for i in range(num_layers) if f"blk.{i}.ffn_gate_inp.weight" not in gguf.tensors]
    if any(n.endswith(".ffn_gate_shexp.weight") for n in gguf.tensors):
        fields["shared_expert_intermediate_size"] = _int_field(gguf, key("expert_shared_feed_forward_length"))
    if arch == "qwen2moe":
        fields["qkv_bias"] = "blk.0.attn_q.bias" in gguf.tensors
    return fields


def _hf_config(gguf: GGUFFile, arch: str) -> dict[str, Any]:
    architecture, model_type, _, _ = ARCHITECTURES[arch]
    name = gguf.field("general.name")
    if arch == "llama" and isinstance(name, str) and "mistral" in name.lower():
        architecture, model_type = "MistralForCausalLM", "mistral"
    if arch in ("llama", "mistral") and gguf.field(f"{arch}.expert_count"):
        architecture, model_type = "MixtralForCausalLM", "mixtral"
    key = lambda suffix: f"{arch}.{suffix}"  # noqa: E731
    hidden = _int_field(gguf, key("embedding_length"))
    heads = _int_field(gguf, key("attention.head_count"))
    head_dim = _int_field(gguf, key("attention.key_length"), default=max(hidden // heads, 1))
    if _int_field(gguf, key("rope.dimension_count"), default=head_dim) != head_dim:
        raise UnsupportedModelError(f"{gguf.path.name}: partial rotary embeddings (rope.dimension_count != head dim)")
    tokens = gguf.reader.fields.get("tokenizer.ggml.tokens")
    theta = _float_field(gguf, key("rope.freq_base"), 10000.0)
    eos = [gguf.field(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    num_layers = _int_field(gguf, key("block_count"), maximum=4096)
    moe = _moe_config(gguf, arch, num_layers)
    return moe | {
        "architectures": [architecture],
        "model_type": model_type,
        "gguf_architecture": arch,
        "vocab_size": _int_field(gguf, key("vocab_size"), default=len(tokens.data) if tokens else None, maximum=1 << 24),
        "hidden_size": hidden,
        "intermediate_size": moe.get("intermediate_size") or _int_field(gguf, key("feed_forward_length")),
        "num_hidden_layers": num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": _int_field(gguf, key("attention.head_count_kv"), default=heads),
        "head_dim": head_dim,
        "rms_norm_eps": _float_field(gguf, key("attention.layer_norm_rms_epsilon"), 1e-5),
        "rope_theta": theta,
        "rope_scaling": _rope_scaling(gguf, arch, head_dim, theta),
        "max_position_embeddings": _int_field(gguf, key("context_length"), default=4096, maximum=_MAX_CONTEXT),
        "tie_word_embeddings": "output.weight" not in gguf.tensors,
        "attention_bias": "blk.0.attn_q.bias" in gguf.tensors and arch in ("llama", "mistral"),
        "hidden_act": "silu",
        "bos_token_id": gguf.field("tokenizer.ggml.bos_token_id"),
        "eos_token_id": sorted({e for e in eos if isinstance(e, int)}) or None,
        "torch_dtype": _FILE_TYPE_DTYPES.get(gguf.field("general.file_type"), "bfloat16"),
    }


def _check_tensors(gguf: GGUFFile, config: ModelArchConfig, qk_norm: bool) -> None:
    file = gguf.path.name
    supported = ", ".join(t.name for t in GGML_TYPES.values())
    for name, info in gguf.tensors.items():
        if name in gguf_names.CONFIG_TENSORS:
            continue
        expected = gguf_names.expected_shape(name, config) if gguf_names.hf_name(name) is not None else None
        if expected is None:
            raise UnsupportedModelError(f"{file}: tensor {name!r} is not part of a {config.model_type} model")
        block = gguf_names.block_index(name)
        if block is not None and block >= config.num_hidden_layers:
            raise ModelLoadError(f"{file}: tensor {name!r} is in block {block}, but the metadata says {config.num_hidden_layers} blocks")
        if info.shape != expected and not (name.endswith("ffn_gate_inp_shexp.weight") and info.shape == (1, *expected)):
            raise ModelLoadError(f"{file}: tensor {name!r} has shape {list(info.shape)}, but the metadata implies {list(expected)}")
        if info.type_id not in GGML_TYPES:
            from gguf import GGMLQuantizationType

            raise ModelLoadError(
                f"{file}: tensor {name!r} has ggml type {GGMLQuantizationType(info.type_id).name}, "
                f"which Octavo does not support ({supported} are)"
            )
    for name in gguf_names.required_names(config, qk_norm):
        if name not in gguf.tensors:
            raise ModelLoadError(f"{file}: tensor {name!r} is missing")


def _raw_modules(gguf: GGUFFile, config: ModelArchConfig) -> dict[str, str]:
    """Checkpoint module name -> ggml type, for the linear layers kept quantized."""
    raw: dict[str, str] = {}
    for layer in range(config.num_hidden_layers):
        for group in _FUSED_GROUPS:
            names = [f"blk.{layer}.{part}.weight" for part in group]
            if any(n not in gguf.tensors for n in names):
                continue  # a sparse layer's dense MLP, or a dense layer's shared expert
            types = [GGML_TYPES[gguf.tensors[n].type_id] for n in names]
            if any(t.is_quantized for t in types):
                for name, ggml_type in zip(names, types):
                    raw[gguf_names.hf_name(name).removesuffix(".weight")] = ggml_type.name
    return raw


def gguf_arch_config(path: Path) -> ModelArchConfig:
    gguf = open_gguf(Path(path))
    arch = _architecture(gguf)
    config = parse_arch_config(_hf_config(gguf, arch))
    _check_tensors(gguf, config, qk_norm=ARCHITECTURES[arch][3])
    raw = _raw_modules(gguf, config)
    config.quantization_config = {"quant_method": "gguf", "raw_modules": raw} if raw else None
    return config


def _raw_rows(gguf: GGUFFile, name: str) -> torch.Tensor:
    """A tensor's bytes as uint8 ``[rows, row_bytes]`` (a copy, off the memory map)."""
    info = gguf.tensors[name]
    data = gguf.reader.data[info.data_offset : info.data_offset + info.num_bytes]
    rows = math.prod(info.shape[:-1])
    return torch.from_numpy(np.array(data, dtype=np.uint8, copy=True)).reshape(rows, -1)


def _read_dequantized(gguf: GGUFFile, name: str) -> torch.Tensor:
    info = gguf.tensors[name]
    return dequantize_gguf(_raw_rows(gguf, name), GGML_TYPES[info.type_id]).reshape(info.shape)


def iterate_gguf_tensors(path: Path, arch: ModelArchConfig) -> Iterator[tuple[str, torch.Tensor]]:
    gguf = open_gguf(Path(path))
    raw_modules = (arch.quantization_config or {}).get("raw_modules", {})
    permuted = ARCHITECTURES[arch.raw.get("gguf_architecture", "llama")][2]
    for name in gguf.tensors:
        if name in gguf_names.CONFIG_TENSORS:
            continue
        hf = gguf_names.hf_name(name)
        module = hf.removesuffix(".weight")
        heads = gguf_names.permuted_heads(name, arch) if permuted else None
        if hf.endswith(".weight") and module in raw_modules:
            tensor, hf = _raw_rows(gguf, name), f"{module}.qweight"
        else:
            tensor = _read_dequantized(gguf, name)
        if heads is not None:
            tensor = gguf_names.unpermute_rows(tensor, heads)
        if "{}" in hf:  # stacked experts: one tensor per expert
            yield from ((hf.format(e), tensor[e]) for e in range(tensor.shape[0]))
        elif hf.endswith("shared_expert_gate.weight"):
            yield hf, tensor.reshape(1, -1)
        else:
            yield hf, tensor


def gguf_tokenizer(path: Path, chat_template: str | None = None) -> Any:
    """The HF fast tokenizer that the file's metadata describes."""
    from transformers import AutoTokenizer

    path = Path(path)
    open_gguf(path)  # refuse a corrupt file before transformers' reader sees it
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    except Exception as exc:  # transformers raises many kinds of errors
        raise ModelLoadError(f"could not build a tokenizer from {path.name}'s metadata: {exc}") from exc
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer
