"""The grid of inputs every layer-op implementation is checked on.

Per op, a few cases: token counts of 1 (decode), 3 and 17 (partial tiles),
odd feature sizes, strided views where layers pass them (per-head norms on
a fused qkv output, rotary on q/k views), biases and none, negative slots
in the KV write, an expert that gets no token, router logits without ties
(integer outputs, a router's expert ids, must be equal). Each case makes the op's
positional arguments on a device in a dtype from a seed, so that the
reference (on the CPU) and the implementation (on the device) see equal
inputs. Quantized weights are made by the formats' own quantizers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

Maker = Callable[[torch.dtype, torch.device, torch.Generator], tuple]


@dataclass(frozen=True)
class OpCase:
    label: str
    num_tokens: int
    make: Maker


def _randn(gen: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) * scale


def _on(device: torch.device, dtype: torch.dtype | None, *tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.to(device=device, dtype=dtype) if dtype is not None else t.to(device) for t in tensors]


def _norm_case(tokens: int, hidden: int, heads: int | None = None) -> OpCase:
    def make(dtype, device, gen):
        if heads is None:
            x = _randn(gen, tokens, hidden, scale=3.0)
        else:  # per-head norm on a view of a wider (fused qkv) row
            x = _randn(gen, tokens, heads * hidden + 3 * hidden)[:, : heads * hidden].reshape(tokens, heads, hidden)
        x, weight = _on(device, dtype, x, _randn(gen, hidden))
        return x, weight, 1e-6

    return OpCase(f"{tokens} tokens x {hidden}" + (f" ({heads} head views)" if heads else ""), tokens, make)


def _qk_norm_case(tokens: int, heads: int, kv_heads: int, head_size: int, weight_offset: float | None) -> OpCase:
    """Queries and keys as views of one fused qkv row (the layer's split)."""

    def make(dtype, device, gen):
        qkv, q_weight, k_weight = _on(
            device, dtype, _randn(gen, tokens, (heads + 2 * kv_heads) * head_size, scale=3.0),
            _randn(gen, head_size), _randn(gen, head_size),
        )
        q, k, _ = qkv.split([heads * head_size, kv_heads * head_size, kv_heads * head_size], dim=-1)
        query, key = q.reshape(tokens, heads, head_size), k.reshape(tokens, kv_heads, head_size)
        return query, key, q_weight, k_weight, 1e-6, weight_offset

    offset = "" if weight_offset is None else f", float32 scale + {weight_offset:g}"
    return OpCase(f"{tokens} tokens, {heads}/{kv_heads} heads x {head_size}{offset}", tokens, make)


def _fused_add_case(tokens: int, hidden: int) -> OpCase:
    def make(dtype, device, gen):
        x, residual, weight = _on(device, dtype, _randn(gen, tokens, hidden), _randn(gen, tokens, hidden), _randn(gen, hidden))
        return x, residual, weight, 1e-5

    return OpCase(f"{tokens} tokens x {hidden}", tokens, make)


def _sandwich_case(tokens: int, hidden: int, weight_offset: float) -> OpCase:
    """Gemma's norm after a block (its output large), the add, the next norm."""

    def make(dtype, device, gen):
        x, residual, post_weight, weight = _on(
            device, dtype, _randn(gen, tokens, hidden, scale=20.0), _randn(gen, tokens, hidden),
            _randn(gen, hidden), _randn(gen, hidden),
        )
        return x, residual, post_weight, weight, 1e-6, weight_offset

    return OpCase(f"{tokens} tokens x {hidden}, offset {weight_offset:g}", tokens, make)


def _layer_norm_case(tokens: int, hidden: int, bias: bool, heads: int | None = None) -> OpCase:
    """A LayerNorm of rows (``heads`` None) or of per-head views of a wider
    (fused qkv) row with a weight per head (Cohere's q/k norms)."""

    def make(dtype, device, gen):
        shape = (hidden,) if heads is None else (heads, hidden)
        if heads is None:
            x = _randn(gen, tokens, hidden, scale=3.0) + 1.5  # a nonzero mean to subtract
        else:
            x = _randn(gen, tokens, heads * hidden + 3 * hidden)[:, : heads * hidden].reshape(tokens, heads, hidden)
        x, weight, b = _on(device, dtype, x, _randn(gen, *shape), _randn(gen, *shape))
        return x, weight, b if bias else None, 1e-5

    label = f"{tokens} tokens x {hidden}" + (f" ({heads} head views, a weight per head)" if heads else "")
    return OpCase(label + (", bias" if bias else ""), tokens, make)


def _with_offset(case: OpCase, weight_offset: float) -> OpCase:
    """A norm case for the ``*_f32_scale`` ops: the same inputs plus ``weight_offset``."""

    def make(dtype, device, gen):
        return (*case.make(dtype, device, gen), weight_offset)

    return OpCase(f"{case.label}, offset {weight_offset:g}", case.num_tokens, make)


def cos_sin_table(head_size: int, max_position: int) -> torch.Tensor:
    """A rotary cos/sin table (base 10000) as ``RotaryEmbedding`` builds it."""
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_size, 2, dtype=torch.float32) / head_size))
    freqs = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def _qkv_views(gen, tokens, heads, kv_heads, head_size, dtype, device):
    width = (heads + 2 * kv_heads) * head_size
    (qkv,) = _on(device, dtype, _randn(gen, tokens, width))
    q = qkv[:, : heads * head_size].view(tokens, heads, head_size)
    k = qkv[:, heads * head_size : (heads + kv_heads) * head_size].view(tokens, kv_heads, head_size)
    v = qkv[:, (heads + kv_heads) * head_size :].view(tokens, kv_heads, head_size)
    return q, k, v


def _rotary_case(tokens: int, heads: int, kv_heads: int, head_size: int, rotary_dim: int | None = None) -> OpCase:
    """With ``rotary_dim``: views of each head's first ``rotary_dim`` dims, as
    a partial rotary (Phi-4-mini, GLM) passes them, and a table as wide."""
    rotary_dim = rotary_dim or head_size

    def make(dtype, device, gen):
        q, k, _ = _qkv_views(gen, tokens, heads, kv_heads, head_size, dtype, device)
        positions = torch.randint(0, 256, (tokens,), generator=gen).to(device)
        return positions, q[..., :rotary_dim], k[..., :rotary_dim], cos_sin_table(rotary_dim, 256).to(device)

    views = "qkv views" if rotary_dim == head_size else f"the first {rotary_dim} dims of each head"
    return OpCase(f"{tokens} tokens, heads {heads}/{kv_heads} x {head_size} ({views})", tokens, make)


def _rotary_cache_case(tokens: int, heads: int, kv_heads: int, head_size: int, block_size: int = 16) -> OpCase:
    def make(dtype, device, gen):
        q, k, v = _qkv_views(gen, tokens, heads, kv_heads, head_size, dtype, device)
        positions = torch.randint(0, 256, (tokens,), generator=gen).to(device)
        num_blocks = 4
        slots = torch.randperm(num_blocks * block_size, generator=gen)[: tokens + 2]
        slots[1] = -1  # a padding token: not written
        cache = _randn(gen, 2, num_blocks, block_size, kv_heads, head_size)
        (cache,) = _on(device, dtype, cache)
        return positions, q, k, v, cos_sin_table(head_size, 256).to(device), cache, slots.to(device)

    return OpCase(f"{tokens} tokens, heads {heads}/{kv_heads} x {head_size}, a negative slot", tokens, make)


def _gated_case(tokens: int, width: int) -> OpCase:
    def make(dtype, device, gen):
        return tuple(_on(device, dtype, _randn(gen, tokens, 2 * width, scale=3.0)))

    return OpCase(f"{tokens} tokens x 2*{width}", tokens, make)


def _linear_case(tokens: int, out_features: int, in_features: int, bias: bool) -> OpCase:
    def make(dtype, device, gen):
        x, weight, b = _on(device, dtype, _randn(gen, tokens, in_features), _randn(gen, out_features, in_features, scale=0.1),
                           _randn(gen, out_features))
        return x, weight, b if bias else None

    return OpCase(f"{tokens} tokens, {in_features} -> {out_features}" + (", bias" if bias else ""), tokens, make)


def _moe_case(tokens: int, experts: int, top_k: int, hidden: int, inter: int, activation: str) -> OpCase:
    def make(dtype, device, gen):
        x, w13, w2 = _on(device, dtype, _randn(gen, tokens, hidden), _randn(gen, experts, 2 * inter, hidden, scale=0.2),
                         _randn(gen, experts, hidden, inter, scale=0.2))
        scores = _randn(gen, tokens, experts - 1)  # the last expert gets no token
        weights, ids = torch.topk(scores.softmax(dim=-1), top_k, dim=-1)
        return x, w13, w2, weights.to(device), ids.to(device), activation

    return OpCase(f"{tokens} tokens, {experts} experts top-{top_k}, {activation}", tokens, make)


def _router_case(tokens: int, experts: int, top_k: int, renormalize: bool) -> OpCase:
    # Distinct logits, multiples of 1/16 (exact in every dtype): no two
    # experts tie, so every implementation must choose the same ids.
    def make(dtype, device, gen):
        ranks = torch.stack([torch.randperm(experts, generator=gen) for _ in range(tokens)])
        (logits,) = _on(device, dtype, (ranks.float() - experts / 2) / 16)
        return logits, top_k, renormalize

    return OpCase(f"{tokens} tokens, {experts} experts top-{top_k}" + (", renormalised" if renormalize else ""), tokens, make)


def _routed_moe_case(tokens: int, experts: int, top_k: int, renormalize: bool) -> OpCase:
    # The router's distinct logits (_router_case: every implementation picks the same experts).
    def make(dtype, device, gen):
        hidden, inter = 32, 16
        x, w13, w2 = _on(device, dtype, _randn(gen, tokens, hidden), _randn(gen, experts, 2 * inter, hidden, scale=0.2),
                         _randn(gen, experts, hidden, inter, scale=0.2))
        ranks = torch.stack([torch.randperm(experts, generator=gen) for _ in range(tokens)])
        (logits,) = _on(device, dtype, (ranks.float() - experts / 2) / 16)
        return x, w13, w2, logits, top_k, renormalize, "silu"

    return OpCase(f"{tokens} tokens, {experts} experts top-{top_k}" + (", renormalised" if renormalize else ""), tokens, make)


def _channel_quant_case(tokens: int, out_features: int, in_features: int, kind: str, bias: bool) -> OpCase:
    def make(dtype, device, gen):
        from octavo.kernels.quant import scaled_mm

        weight = _randn(gen, out_features, in_features, scale=0.05)
        quantize = scaled_mm.quantize_fp8_per_channel if kind == "fp8" else scaled_mm.quantize_int8_per_channel
        qweight, scale = quantize(weight)
        x, b = _on(device, dtype, _randn(gen, tokens, in_features), _randn(gen, out_features))
        return x, qweight.to(device), scale.to(device), b if bias else None

    return OpCase(f"{tokens} tokens, {in_features} -> {out_features}" + (", bias" if bias else ""), tokens, make)


def _block_fp8_case(tokens: int, out_features: int, in_features: int, block: tuple[int, int], bias: bool) -> OpCase:
    """A block-scaled fp8 weight (ragged last blocks where the dims are not multiples)."""

    def make(dtype, device, gen):
        from octavo.kernels.quant import scaled_mm

        qweight, scale = scaled_mm.quantize_fp8_block(_randn(gen, out_features, in_features, scale=0.05), *block)
        x, b = _on(device, dtype, _randn(gen, tokens, in_features), _randn(gen, out_features))
        return x, qweight.to(device), scale.to(device), block[0], block[1], b if bias else None

    return OpCase(f"{tokens} tokens, {in_features} -> {out_features}, blocks {block}" + (", bias" if bias else ""), tokens, make)


def _norm_linear_case(tokens: int, out_features: int, hidden: int, bias: bool) -> OpCase:
    """The residual add and norm before an unquantized projection (a layer's qkv)."""

    def make(dtype, device, gen):
        x, residual, norm_weight, weight, b = _on(
            device, dtype, _randn(gen, tokens, hidden), _randn(gen, tokens, hidden), _randn(gen, hidden),
            _randn(gen, out_features, hidden, scale=0.1), _randn(gen, out_features),
        )
        return x, residual, norm_weight, 1e-6, weight, b if bias else None

    return OpCase(f"{tokens} tokens, {hidden} -> {out_features}" + (", bias" if bias else ""), tokens, make)


def _norm_route_case(tokens: int, experts: int, top_k: int, renormalize: bool, hidden: int) -> OpCase:
    """The norm before a MoE layer, its router and top-k. Every router row
    is a distinct multiple of one direction that all tokens' normed rows
    lean along (their sum), so the logits are well apart in every dtype
    and every implementation must pick the same experts."""

    def make(dtype, device, gen):
        from octavo.ops import reference

        shared = _randn(gen, hidden)
        x = shared + 0.3 * _randn(gen, tokens, hidden)
        residual, norm_weight = 0.5 * _randn(gen, tokens, hidden), 1.0 + 0.1 * _randn(gen, hidden)
        normed, _ = reference.fused_add_rms_norm(x, residual, norm_weight, 1e-6)
        direction = normed.sum(dim=0) / (tokens * hidden)
        multiples = (torch.randperm(experts, generator=gen).float() - experts / 2) / 16
        router = multiples[:, None] * direction[None, :]
        x, residual, norm_weight, router = _on(device, dtype, x, residual, norm_weight, router)
        return x, residual, norm_weight, 1e-6, router, top_k, renormalize

    label = f"{tokens} tokens, {hidden} -> {experts} experts top-{top_k}" + (", renormalised" if renormalize else "")
    return OpCase(label, tokens, make)


def _norm_fp8_linear_case(tokens: int, out_features: int, hidden: int, bias: bool) -> OpCase:
    """The residual add and norm before an fp8 projection (qkv, gate-up)."""

    def make(dtype, device, gen):
        from octavo.kernels.quant import scaled_mm

        qweight, scale = scaled_mm.quantize_fp8_per_channel(_randn(gen, out_features, hidden, scale=0.05))
        x, residual, norm_weight, b = _on(
            device, dtype, _randn(gen, tokens, hidden), _randn(gen, tokens, hidden), _randn(gen, hidden),
            _randn(gen, out_features),
        )
        return x, residual, norm_weight, 1e-6, qweight.to(device), scale.to(device), b if bias else None

    return OpCase(f"{tokens} tokens, {hidden} -> {out_features}" + (", bias" if bias else ""), tokens, make)


def _silu_fp8_linear_case(tokens: int, out_features: int, intermediate: int, bias: bool) -> OpCase:
    """A gated MLP's activation and its fp8 down projection."""

    def make(dtype, device, gen):
        from octavo.kernels.quant import scaled_mm

        qweight, scale = scaled_mm.quantize_fp8_per_channel(_randn(gen, out_features, intermediate, scale=0.05))
        x, b = _on(device, dtype, _randn(gen, tokens, 2 * intermediate, scale=2.0), _randn(gen, out_features))
        return x, qweight.to(device), scale.to(device), b if bias else None

    return OpCase(f"{tokens} tokens, 2 x {intermediate} -> {out_features}" + (", bias" if bias else ""), tokens, make)


def _int4_case(tokens: int, out_features: int, in_features: int, group_size: int, bias: bool, bits: int = 4) -> OpCase:
    def make(dtype, device, gen):
        from octavo.kernels.quant.int4 import quantize_grouped_rtn

        weight = _randn(gen, out_features, in_features, scale=0.05).to(dtype)
        qweight, scales, zeros = quantize_grouped_rtn(weight, group_size, bits)
        x, b = _on(device, dtype, _randn(gen, tokens, in_features), _randn(gen, out_features))
        return x, qweight.to(device), scales.to(device), zeros.to(device), group_size, b if bias else None

    label = f"{tokens} tokens, {in_features} -> {out_features}, {bits}-bit groups of {group_size}" + (", bias" if bias else "")
    return OpCase(label, tokens, make)


def _gguf_case(tokens: int, out_features: int, in_features: int, type_name: str) -> OpCase:
    def make(dtype, device, gen):
        from octavo.kernels.quant.gguf_dequant import GGML_TYPES_BY_NAME, random_gguf_rows

        raw = random_gguf_rows(type_name, out_features, in_features, gen)
        (x,) = _on(device, dtype, _randn(gen, tokens, in_features))
        return x, raw.to(device), GGML_TYPES_BY_NAME[type_name]

    return OpCase(f"{tokens} tokens, {type_name} {in_features} -> {out_features}", tokens, make)


def _encoder_attention_case(seq_lens: tuple[int, ...], heads: int, head_size: int) -> OpCase:
    """A flat batch of ``seq_lens``, with the grid's arrays as a step makes them
    (padding rows, whose values the op leaves unspecified, are not compared:
    ``tests/gpu/test_gpu_pooling.py`` runs padded steps end to end)."""
    import numpy as np

    from octavo.models.layers.encoder_attention import EncoderAttentionMetadata

    lengths = np.array(seq_lens)
    num_tokens = int(lengths.sum())

    def make(dtype, device, gen):
        arrays = EncoderAttentionMetadata.host_arrays(lengths)
        qkv = _randn(gen, num_tokens, 3 * heads * head_size)
        key_bias = arrays.get("key_bias")
        key_bias = None if key_bias is None else torch.from_numpy(key_bias).to(device=device, dtype=dtype)
        cu_seqlens, grid_index, token_cells = (torch.from_numpy(arrays[name]).to(device)
                                               for name in ("attn_cu_seqlens", "grid_index", "token_cells"))
        max_seqlen = int(lengths.max())
        return (*_on(device, dtype, qkv), cu_seqlens, max_seqlen, grid_index, token_cells, key_bias, heads, head_size**-0.5)

    return OpCase(f"seqs={list(seq_lens)} heads={heads} d={head_size}", num_tokens, make)


def _tokens_grid(make_case, *args) -> list[OpCase]:
    return [make_case(tokens, *args) for tokens in (1, 3, 17)]


OP_CASES: dict[str, list[OpCase]] = {
    "qk_rms_norm": [_qk_norm_case(1, 8, 2, 64, None), _qk_norm_case(3, 4, 4, 32, 1.0), _qk_norm_case(17, 6, 2, 128, 0.0)],
    "rms_norm": [_norm_case(1, 64), _norm_case(3, 96), _norm_case(17, 256), _norm_case(5, 32, heads=4)],
    "fused_add_rms_norm": _tokens_grid(_fused_add_case, 96),
    "rms_norm_f32_scale": [_with_offset(_norm_case(1, 64), 1.0), _with_offset(_norm_case(17, 256), 0.0),
                           _with_offset(_norm_case(5, 32, heads=4), 1.0)],
    "fused_add_rms_norm_f32_scale": [_with_offset(case, 1.0) for case in _tokens_grid(_fused_add_case, 96)],
    "post_norm_add_rms_norm_f32_scale": [_sandwich_case(1, 96, 1.0), _sandwich_case(3, 200, 0.0),
                                         _sandwich_case(17, 96, 1.0)],
    "rotary_embedding": [_rotary_case(1, 4, 2, 32), _rotary_case(3, 8, 1, 64), _rotary_case(17, 4, 4, 128),
                         _rotary_case(5, 4, 2, 32, rotary_dim=24)],
    "rotary_and_cache": [_rotary_cache_case(1, 4, 2, 32), _rotary_cache_case(3, 8, 1, 64), _rotary_cache_case(17, 4, 4, 128)],
    "silu_and_mul": _tokens_grid(_gated_case, 300),
    "gelu_and_mul": _tokens_grid(_gated_case, 300),
    "gelu_tanh_and_mul": _tokens_grid(_gated_case, 300),
    "linear": [_linear_case(1, 44, 96, True), _linear_case(1, 64, 256, False), _linear_case(3, 40, 64, True),
               _linear_case(17, 64, 96, False)],
    "linear_silu_and_mul": [_linear_case(1, 2 * 36, 80, False), _linear_case(1, 2 * 64, 256, True),
                            _linear_case(3, 2 * 36, 80, True), _linear_case(17, 2 * 32, 64, False)],
    "linear_gelu_tanh_and_mul": [_linear_case(1, 2 * 36, 80, False), _linear_case(1, 2 * 64, 256, True),
                                 _linear_case(3, 2 * 36, 80, True), _linear_case(17, 2 * 32, 64, False)],
    "moe_topk_softmax": [_router_case(1, 128, 8, True), _router_case(3, 8, 2, True), _router_case(17, 60, 4, False)],
    "fused_moe_routed": [_routed_moe_case(1, 16, 4, True), _routed_moe_case(1, 8, 8, False), _routed_moe_case(3, 8, 2, True)],
    "fused_moe": [_moe_case(1, 8, 2, 64, 32, "silu"), _moe_case(5, 8, 2, 64, 32, "silu"),
                  _moe_case(17, 8, 7, 32, 48, "gelu_tanh"), _moe_case(3, 4, 3, 32, 16, "gelu")],
    "fp8_linear": [_channel_quant_case(t, 64, 128, "fp8", bias) for t, bias in ((1, False), (3, True), (17, False))],
    "fp8_block_linear": [_block_fp8_case(1, 64, 256, (32, 64), False), _block_fp8_case(3, 80, 192, (32, 128), True),
                         _block_fp8_case(17, 64, 128, (64, 64), False)],
    "int8_linear": [_channel_quant_case(t, 64, 128, "int8", bias) for t, bias in ((1, False), (3, True), (17, False))],
    "int8_weight_only_linear": [_channel_quant_case(t, 64, 128, "int8", bias) for t, bias in ((1, True), (17, False))],
    "int4_linear": [_int4_case(1, 64, 256, 128, False), _int4_case(3, 64, 128, 32, True), _int4_case(17, 48, 256, 64, False)],
    "int8_grouped_linear": [_int4_case(1, 64, 256, 128, False, bits=8), _int4_case(3, 48, 128, 32, True, bits=8),
                            _int4_case(17, 64, 256, 64, False, bits=8)],
    "gguf_linear": [_gguf_case(1, 32, 256, name) for name in ("Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K")]
    + [_gguf_case(17, 32, 256, "Q4_K"), _gguf_case(40, 32, 256, "Q8_0")],
    "fused_add_rms_norm_fp8_linear": [_norm_fp8_linear_case(t, 48, 128, bias) for t, bias in ((1, False), (3, True), (17, False))],
    "silu_and_mul_fp8_linear": [_silu_fp8_linear_case(t, 64, 96, bias) for t, bias in ((1, True), (3, False), (17, True))],
    "fused_add_rms_norm_linear": [_norm_linear_case(1, 44, 96, True), _norm_linear_case(1, 64, 256, False),
                                  _norm_linear_case(3, 40, 64, True), _norm_linear_case(17, 64, 96, False)],
    "fused_add_rms_norm_route": [_norm_route_case(1, 128, 8, True, 64), _norm_route_case(3, 8, 2, False, 96),
                                 _norm_route_case(8, 60, 4, True, 32), _norm_route_case(17, 16, 16, False, 32)],
    "layer_norm": [_layer_norm_case(1, 64, True), _layer_norm_case(3, 96, False), _layer_norm_case(17, 256, True),
                   _layer_norm_case(5, 32, False, heads=4)],
    "encoder_attention": [_encoder_attention_case((1,), 2, 32), _encoder_attention_case((5, 1, 17, 3), 4, 32),
                          _encoder_attention_case((8, 8), 2, 64), _encoder_attention_case((6, 2, 9), 3, 64)],
}
