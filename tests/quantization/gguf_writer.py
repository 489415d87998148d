"""Writing test GGUF files from small HF checkpoints, with the ``gguf`` package.

Tensors are quantized with ``gguf.quants`` where it has a quantizer (Q8_0,
Q4_0, Q4_1, Q5_0, Q5_1, BF16) and with the packers below for the K-quants
and IQ4_NL / IQ4_XS (the ``gguf`` package only dequantizes those). The packers are written from the block layouts in
the ggml spec; they are checked against ``gguf.quants.dequantize``.
llama/mistral q and k rows are permuted the way llama.cpp's converter does.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ARCH_KEYS = {
    "llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
    "mixtral": "llama", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe",
}
PERMUTED = ("llama", "mistral", "mixtral")
HF_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
HF_BLOCK = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "block_sparse_moe.gate.weight": "ffn_gate_inp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
}
# One expert's projection (HF) -> the stacked GGUF tensor of all experts.
_EXPERT = re.compile(r"^model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight$")
_EXPERT_PARTS = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up", "down_proj": "down", "w2": "down"}


def _f16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _k_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Eight 6-bit (scale, min) pairs -> Q4_K/Q5_K's 12 bytes."""
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    out = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = (mn[:, 0:4] & 63) | ((mn[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0xF) | ((mn[:, 4:8] & 0xF) << 4)
    return out


def _k_affine(blocks: np.ndarray, levels: int):
    """Per 32-value sub-block: value = d*sc*q - dmin*m, sc and m 6-bit."""
    sub = blocks.reshape(-1, 8, 32)
    low = np.minimum(sub.min(axis=-1), 0.0)
    high = np.maximum(sub.max(axis=-1), 0.0)
    scale, minimum = (high - low) / levels, -low
    d = (scale.max(axis=-1) / 63).astype(np.float16).astype(np.float32)
    dmin = (minimum.max(axis=-1) / 63).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(scale / np.where(d == 0, 1, d)[:, None]), 0, 63)
    mn = np.clip(np.round(minimum / np.where(dmin == 0, 1, dmin)[:, None]), 0, 63)
    step = d[:, None] * sc
    q = np.round((sub + (dmin[:, None] * mn)[..., None]) / np.where(step == 0, 1, step)[..., None])
    q = np.clip(q, 0, levels).astype(np.uint8).reshape(-1, 256)
    return d, dmin, sc, mn, q


def _nibbles_k(q: np.ndarray) -> np.ndarray:
    """256 values (low 4 bits) -> 128 bytes: byte 32c+l = q[64c+l] | q[64c+32+l] << 4."""
    q = (q & 0xF).reshape(-1, 4, 2, 32)
    return (q[:, :, 0, :] | (q[:, :, 1, :] << 4)).reshape(-1, 128)


def quantize_q4_k(blocks: np.ndarray) -> np.ndarray:
    d, dmin, sc, mn, q = _k_affine(blocks, 15)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _k_scales(sc, mn), _nibbles_k(q)], axis=1)


def quantize_q5_k(blocks: np.ndarray) -> np.ndarray:
    d, dmin, sc, mn, q = _k_affine(blocks, 31)
    high = (q >> 4).reshape(-1, 8, 32)  # bit i of byte l: value 32i + l
    qh = np.zeros((q.shape[0], 32), dtype=np.uint8)
    for bit in range(8):
        qh |= (high[:, bit, :] << bit).astype(np.uint8)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _k_scales(sc, mn), qh, _nibbles_k(q)], axis=1)


def quantize_q6_k(blocks: np.ndarray) -> np.ndarray:
    sub = blocks.reshape(-1, 16, 16)
    scale = np.abs(sub).max(axis=-1) / 31
    d = (scale.max(axis=-1) / 127).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(scale / np.where(d == 0, 1, d)[:, None]), -128, 127)
    step = d[:, None] * sc
    q = np.clip(np.round(sub / np.where(step == 0, 1, step)[..., None]), -32, 31).astype(np.int16) + 32
    q = q.reshape(-1, 256).astype(np.uint8)
    low, high = (q & 0xF).reshape(-1, 2, 2, 64), (q >> 4).reshape(-1, 2, 4, 32)
    ql = (low[:, :, 0, :] | (low[:, :, 1, :] << 4)).reshape(-1, 128)
    qh = np.zeros((q.shape[0], 2, 32), dtype=np.uint8)
    for t in range(4):
        qh |= (high[:, :, t, :] << (2 * t)).astype(np.uint8)
    return np.concatenate([ql, qh.reshape(-1, 64), sc.astype(np.int8).view(np.uint8), _f16_bytes(d)], axis=1)


def _two_bit_bytes(q: np.ndarray) -> np.ndarray:
    """256 values (low 2 bits) -> 64 bytes: value 128h + 32s + l in bits 2s of byte 32h + l."""
    q = (q & 3).reshape(-1, 2, 4, 32).astype(np.uint8)
    out = np.zeros((q.shape[0], 2, 32), dtype=np.uint8)
    for s in range(4):
        out |= q[:, :, s, :] << (2 * s)
    return out.reshape(-1, 64)


def quantize_q2_k(blocks: np.ndarray) -> np.ndarray:
    """16 sub-blocks of 16: value = d * sc * q - dmin * m, q in 0..3, sc and m 4-bit."""
    sub = blocks.reshape(-1, 16, 16)
    low, high = np.minimum(sub.min(axis=-1), 0.0), np.maximum(sub.max(axis=-1), 0.0)
    scale, minimum = (high - low) / 3, -low
    d = (scale.max(axis=-1) / 15).astype(np.float16).astype(np.float32)
    dmin = (minimum.max(axis=-1) / 15).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(scale / np.where(d == 0, 1, d)[:, None]), 0, 15)
    mn = np.clip(np.round(minimum / np.where(dmin == 0, 1, dmin)[:, None]), 0, 15)
    step = d[:, None] * sc
    q = np.round((sub + (dmin[:, None] * mn)[..., None]) / np.where(step == 0, 1, step)[..., None])
    q = np.clip(q, 0, 3).astype(np.uint8).reshape(-1, 256)
    scales = (sc.astype(np.uint8) | (mn.astype(np.uint8) << 4))
    return np.concatenate([scales, _two_bit_bytes(q), _f16_bytes(d), _f16_bytes(dmin)], axis=1)


def quantize_q3_k(blocks: np.ndarray) -> np.ndarray:
    """16 sub-blocks of 16: value = d * (sc - 32) * q, q in -4..3, sc 6-bit."""
    sub = blocks.reshape(-1, 16, 16)
    scale = np.abs(sub).max(axis=-1) / 4
    d = (scale.max(axis=-1) / 31).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(scale / np.where(d == 0, 1, d)[:, None]), 0, 31) + 32
    step = d[:, None] * (sc - 32)
    q = np.clip(np.round(sub / np.where(step == 0, 1, step)[..., None]), -4, 3).astype(np.int16) + 4
    q = q.reshape(-1, 256).astype(np.uint8)
    high = (q >> 2).reshape(-1, 8, 32)  # bit b of hmask byte l: value 32b + l
    hmask = np.zeros((q.shape[0], 32), dtype=np.uint8)
    for bit in range(8):
        hmask |= (high[:, bit, :] << bit).astype(np.uint8)
    sc = sc.astype(np.uint8)
    packed = np.zeros((q.shape[0], 12), dtype=np.uint8)
    for i in range(16):
        packed[:, i % 8] |= (sc[:, i] & 0xF) << (4 * (i // 8))
        packed[:, 8 + i % 4] |= (sc[:, i] >> 4) << (2 * (i // 4))
    return np.concatenate([hmask, _two_bit_bytes(q), packed, _f16_bytes(d)], axis=1)


IQ4_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)


def _iq4_indices(values: np.ndarray, scale: np.ndarray) -> np.ndarray:
    targets = values / np.where(scale == 0, 1, scale)[..., None]
    return np.abs(targets[..., None] - IQ4_LEVELS).argmin(axis=-1).astype(np.uint8)


def _nibble_pairs(q: np.ndarray) -> np.ndarray:
    """[..., 32] indices -> [..., 16] bytes: q[j] | q[j + 16] << 4."""
    return q[..., :16] | (q[..., 16:] << 4)


def quantize_iq4_nl(blocks: np.ndarray) -> np.ndarray:
    sub = blocks.reshape(-1, 32)
    d = (np.abs(sub).max(axis=-1) / 127).astype(np.float16).astype(np.float32)
    return np.concatenate([_f16_bytes(d), _nibble_pairs(_iq4_indices(sub, d))], axis=1)


def quantize_iq4_xs(blocks: np.ndarray) -> np.ndarray:
    sub = blocks.reshape(-1, 8, 32)
    scale = np.abs(sub).max(axis=-1) / 127
    d = (scale.max(axis=-1) / 31).astype(np.float16).astype(np.float32)
    ls = (np.clip(np.round(scale / np.where(d == 0, 1, d)[:, None]), 0, 31) + 32).astype(np.uint16)
    q = _iq4_indices(sub, d[:, None] * (ls.astype(np.float32) - 32))
    high = np.zeros(ls.shape[0], dtype=np.uint16)
    low = np.zeros((ls.shape[0], 4), dtype=np.uint8)
    for ib in range(8):
        high |= ((ls[:, ib] >> 4) & 3) << (2 * ib)
        low[:, ib // 2] |= ((ls[:, ib] & 0xF) << (4 * (ib % 2))).astype(np.uint8)
    return np.concatenate([_f16_bytes(d), high.reshape(-1, 1).view(np.uint8), low, _nibble_pairs(q).reshape(-1, 128)], axis=1)


_K_PACKERS = {
    "Q2_K": quantize_q2_k, "Q3_K": quantize_q3_k, "Q4_K": quantize_q4_k, "Q5_K": quantize_q5_k, "Q6_K": quantize_q6_k,
    "IQ4_XS": quantize_iq4_xs,
}
_BLOCK_PACKERS = {"IQ4_NL": quantize_iq4_nl}


def quantize(values: np.ndarray, type_name: str) -> np.ndarray:
    """float32 ``[rows, K]`` -> the tensor as the GGUF writer takes it."""
    import gguf

    values = np.ascontiguousarray(values, dtype=np.float32)
    if type_name == "F32":
        return values
    if type_name == "F16":
        return values.astype(np.float16)
    if type_name in _K_PACKERS or type_name in _BLOCK_PACKERS:
        rows = values.reshape(-1, values.shape[-1])
        packer, block = (_K_PACKERS[type_name], 256) if type_name in _K_PACKERS else (_BLOCK_PACKERS[type_name], 32)
        packed = packer(rows.reshape(-1, block))
        return packed.reshape(*values.shape[:-1], -1)
    return gguf.quants.quantize(values, gguf.GGMLQuantizationType[type_name])


def permute_rows(weights: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's q/k permutation (HF "rotate half" rows -> interleaved pairs)."""
    shape = weights.shape
    return weights.reshape(num_heads, 2, shape[0] // num_heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def gguf_tensor_name(hf_name: str) -> str:
    if hf_name in HF_TO_GGUF:
        return HF_TO_GGUF[hf_name]
    parts = hf_name.split(".")
    return f"blk.{parts[2]}.{HF_BLOCK['.'.join(parts[3:])]}"


def stack_experts(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-expert HF tensors replaced by llama.cpp's stacked ``blk.N.ffn_*_exps`` (by GGUF name)."""
    stacked: dict[tuple[str, str], dict[int, np.ndarray]] = {}
    rest = {}
    for name, value in tensors.items():
        match = _EXPERT.match(name)
        if match is None:
            rest[name] = value
            continue
        layer, expert, part = match.groups()
        stacked.setdefault((layer, _EXPERT_PARTS[part]), {})[int(expert)] = value
    for (layer, part), experts in stacked.items():
        rest[f"blk.{layer}.ffn_{part}_exps.weight"] = np.stack([experts[e] for e in sorted(experts)])
    return rest


def _add_moe_metadata(writer, config: dict) -> None:
    experts = config.get("num_local_experts") or config.get("num_experts")
    if not experts:
        return
    writer.add_expert_count(experts)
    writer.add_expert_used_count(config["num_experts_per_tok"])
    writer.add_expert_feed_forward_length(config.get("moe_intermediate_size") or config["intermediate_size"])
    if config.get("shared_expert_intermediate_size"):
        writer.add_expert_shared_feed_forward_length(config["shared_expert_intermediate_size"])


def _write_tokenizer(writer, tokenizer_dir: Path) -> None:
    data = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    tokens = [None] * len(vocab)
    for token, index in vocab.items():
        tokens[index] = token
    special = {t["id"] for t in data.get("added_tokens", []) if t.get("special")}
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if i in special else 1 for i in range(len(tokens))])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(vocab[config["bos_token"]])
    writer.add_eos_token_id(vocab[config["eos_token"]])
    writer.add_pad_token_id(vocab[config["pad_token"]])
    writer.add_add_bos_token(bool(config.get("add_bos_token", False)))
    writer.add_chat_template(config["chat_template"])


@dataclass
class GGUFVariant:
    """Deviations from a faithful export, for bad-input tests: ``default_type``
    for tensors ``types`` does not name, ``config_overrides`` for the
    metadata written, ``skip`` tensors left out, ``extra_tensors`` added as
    ``{name: (raw data, ggml type)}``."""

    default_type: str = "F32"
    config_overrides: dict = field(default_factory=dict)
    skip: tuple[str, ...] = ()
    extra_tensors: dict[str, tuple[np.ndarray, str]] = field(default_factory=dict)


def write_gguf(checkpoint_dir: Path, out_path: Path, arch: str, types: dict[str, str], variant: GGUFVariant | None = None) -> Path:
    """Write ``checkpoint_dir`` (an HF checkpoint + tokenizer) as a GGUF file.

    ``types`` maps a GGUF tensor-name suffix (e.g. ``"attn_v.weight"``) or a
    full name to its ggml type; 1-D tensors are always F32 (as llama.cpp).
    """
    variant = variant or GGUFVariant()
    import gguf
    from safetensors.numpy import load_file

    config = json.loads((checkpoint_dir / "config.json").read_text())
    config.update(variant.config_overrides)
    tensors = load_file(str(checkpoint_dir / "model.safetensors"))
    key = ARCH_KEYS[arch]
    writer = gguf.GGUFWriter(str(out_path), key)
    writer.add_name(f"test-{arch}")
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(float(config.get("rope_theta") or (config.get("rope_parameters") or {}).get("rope_theta", 10000.0)))
    writer.add_rope_dimension_count(head_dim)
    if arch in ("qwen3", "qwen3_moe"):
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    _add_moe_metadata(writer, config)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    _write_tokenizer(writer, checkpoint_dir)
    for name, value in stack_experts(tensors).items():
        if name == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue
        name = name if name.startswith("blk.") else gguf_tensor_name(name)
        if name in variant.skip:
            continue
        value = value.astype(np.float32)
        if name.endswith("ffn_gate_inp_shexp.weight"):
            value = value.reshape(-1)  # llama.cpp stores HF's [1, H] as [H]
        if arch in PERMUTED and (".attn_q." in name or ".attn_k." in name):
            value = permute_rows(value, heads if ".attn_q." in name else kv_heads)
        suffix = ".".join(name.split(".")[-2:])
        type_name = "F32" if value.ndim == 1 else types.get(name, types.get(suffix, variant.default_type))
        data = quantize(value, type_name)
        writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[type_name])
    for name, (data, type_name) in variant.extra_tensors.items():
        writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[type_name])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path
