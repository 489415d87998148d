"""The Llama decoder, and the family that shares its shape.

Llama 2/3/3.1 and Mistral are this class as is; Qwen2 adds biases on q, k
and v (``qwen2.py``); Qwen3 adds RMSNorm on each q and k head (``qwen3.py``).
Projections are fused (qkv, gate-up) and split across tensor-parallel ranks.
Every layer computes through the layer ops resolved for this model
(``ctx.ops``; the layers take them from the scope the builder opens).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from octavo.core.attention import AttentionSpec
from octavo.distributed.parallel_state import get_pp_group
from octavo.errors import UnsupportedModelError
from octavo.models.base import ModelInitContext
from octavo.models.layers.activation import gated_activation
from octavo.models.layers.attention import Attention, ForwardContext, kv_scale_param_name
from octavo.models.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from octavo.models.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from octavo.models.layers.norm import RMSNorm
from octavo.models.layers.rotary import RotaryEmbedding
from octavo.models.weight_loading import check_all_loaded, load_named_tensors
from octavo.quantization.base import UnquantizedLinearMethod


class DecoderAttention(nn.Module):
    def __init__(self, ctx: ModelInitContext, layer_index: int, prefix: str, qkv_bias: bool, o_bias: bool, qk_norm: bool):
        super().__init__()
        config = ctx.config
        self.head_size = config.head_dim
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, self.head_size, config.num_attention_heads, config.num_key_value_heads,
            bias=qkv_bias, quant_config=ctx.quant_config, prefix=f"{prefix}.qkv_proj", params_dtype=ctx.dtype,
        )
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = self.num_heads * self.head_size, self.num_kv_heads * self.head_size
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * self.head_size, config.hidden_size, bias=o_bias,
            quant_config=ctx.quant_config, prefix=f"{prefix}.o_proj", params_dtype=ctx.dtype,
        )
        self.q_norm = RMSNorm(self.head_size, config.rms_norm_eps, ctx.dtype) if qk_norm else None
        self.k_norm = RMSNorm(self.head_size, config.rms_norm_eps, ctx.dtype) if qk_norm else None
        self.rotary_emb = RotaryEmbedding(self.head_size, ctx.max_model_len, config.rope_theta, config.rope_parameters)
        spec = AttentionSpec(
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_size=self.head_size,
            scale=self.head_size**-0.5,
            dtype=ctx.dtype,
            kv_cache_dtype=ctx.kv_cache_dtype,
            block_size=ctx.block_size,
            sliding_window=config.sliding_windows[layer_index],
        )
        self.attn = Attention(ctx.attention_backend(spec), layer_index)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, fctx: ForwardContext) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(num_tokens, self.num_heads, self.head_size)
        k = k.reshape(num_tokens, self.num_kv_heads, self.head_size)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_size)
        out = self.attn(q, k, v, fctx, positions=positions, rotary=self.rotary_emb)
        return self.o_proj(out)


class DecoderMLP(nn.Module):
    def __init__(self, ctx: ModelInitContext, prefix: str):
        super().__init__()
        config = ctx.config
        if config.hidden_act not in ("silu", "swish"):
            raise UnsupportedModelError(f"hidden_act {config.hidden_act!r} is not supported (silu is)")
        self.act_fn = gated_activation(config.hidden_act, ctx.ops)
        self.gate_up_proj = MergedColumnParallelLinear(
            config.hidden_size, [config.intermediate_size] * 2, bias=config.mlp_bias,
            quant_config=ctx.quant_config, prefix=f"{prefix}.gate_up_proj", params_dtype=ctx.dtype,
        )
        self.down_proj = RowParallelLinear(
            config.intermediate_size, config.hidden_size, bias=config.mlp_bias,
            quant_config=ctx.quant_config, prefix=f"{prefix}.down_proj", params_dtype=ctx.dtype,
        )
        # An unquantized gate-up projection and its activation are one op,
        # ``linear_silu_and_mul`` (one launch at decode where the platform has
        # it; otherwise the resolved linear, then silu_and_mul).
        fused = type(self.gate_up_proj.quant_method) is UnquantizedLinearMethod
        self.linear_silu_and_mul = ctx.ops.linear_silu_and_mul if fused else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.linear_silu_and_mul is not None:
            up = self.gate_up_proj
            return self.down_proj(self.linear_silu_and_mul(x, up.weight, up.bias))
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, ctx: ModelInitContext, layer_index: int, prefix: str, qkv_bias: bool, o_bias: bool, qk_norm: bool):
        super().__init__()
        config = ctx.config
        self.self_attn = DecoderAttention(ctx, layer_index, f"{prefix}.self_attn", qkv_bias, o_bias, qk_norm)
        self.mlp = DecoderMLP(ctx, f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ctx.dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ctx.dtype)

    def forward(self, positions, hidden, residual, fctx: ForwardContext):
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, fctx)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


def layer_range(num_layers: int) -> tuple[int, int]:
    """The layers this pipeline-parallel rank holds (earlier ranks take the remainder)."""
    pp = get_pp_group()
    base, extra = divmod(num_layers, pp.world_size)
    start = pp.rank * base + min(pp.rank, extra)
    return start, start + base + (1 if pp.rank < extra else 0)


class DecoderModel(nn.Module):
    def __init__(self, ctx: ModelInitContext, qkv_bias: bool, o_bias: bool, qk_norm: bool):
        super().__init__()
        config = ctx.config
        self.start_layer, self.end_layer = layer_range(config.num_hidden_layers)
        pp = get_pp_group()
        self.embed_tokens = (
            VocabParallelEmbedding(config.vocab_size, config.hidden_size, ctx.dtype, "model.embed_tokens")
            if pp.is_first or config.tie_word_embeddings
            else None
        )
        # Layers outside this rank's range are absent (None keeps indices stable).
        self.layers = nn.ModuleList(
            [
                DecoderLayer(ctx, i, f"model.layers.{i}", qkv_bias, o_bias, qk_norm)
                if self.start_layer <= i < self.end_layer
                else nn.Identity()
                for i in range(config.num_hidden_layers)
            ]
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, ctx.dtype) if pp.is_last else None

    def forward(self, input_ids, positions, fctx: ForwardContext, intermediate=None):
        """First PP rank: embed ``input_ids``; other ranks continue ``intermediate``
        (hidden, residual). Last rank returns normed hidden states."""
        if intermediate is None:
            hidden, residual = self.embed_tokens(input_ids), None
        else:
            hidden, residual = intermediate
        for layer in self.layers[self.start_layer : self.end_layer]:
            hidden, residual = layer(positions, hidden, residual, fctx)
        if self.norm is None:
            return hidden, residual
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    # How the HF checkpoint's separate projections map onto fused layers.
    stacked_params = (
        ("qkv_proj", "q_proj", "q"),
        ("qkv_proj", "k_proj", "k"),
        ("qkv_proj", "v_proj", "v"),
        ("gate_up_proj", "gate_proj", 0),
        ("gate_up_proj", "up_proj", 1),
    )
    qk_norm = False
    # Pooling variants (decoder_pooling.py) are built without the LM head.
    has_lm_head = True

    @staticmethod
    def has_qkv_bias(config) -> bool:
        return config.attention_bias

    @staticmethod
    def has_o_bias(config) -> bool:
        return config.attention_bias

    def __init__(self, ctx: ModelInitContext) -> None:
        super().__init__()
        config = ctx.config
        self.config = config
        self.model = DecoderModel(ctx, self.has_qkv_bias(config), self.has_o_bias(config), self.qk_norm)
        self.lm_head = None
        if get_pp_group().is_last and self.has_lm_head:
            tie = self.model.embed_tokens if config.tie_word_embeddings else None
            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, ctx.dtype, "lm_head", tie_to=tie)

    def forward(self, input_ids, positions, fctx: ForwardContext, intermediate=None):
        return self.model(input_ids, positions, fctx, intermediate)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head.compute_logits(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy checkpoint tensors into parameters; raise on missing ones."""
        loaded = load_named_tensors(self, weights, self._checkpoint_name)
        tied_head = self.config.tie_word_embeddings
        check_all_loaded(
            self, loaded, {"qkv_proj": ("q", "k", "v"), "gate_up_proj": (0, 1)},
            skip=lambda name: tied_head and name == "lm_head.weight",
        )
        return loaded

    def _checkpoint_name(self, name: str) -> tuple[str, object] | None:
        """The parameter (and fused shard) a checkpoint tensor goes to; None: skip it."""
        if "rotary_emb.inv_freq" in name:
            return None
        if name == "lm_head.weight" and self.config.tie_word_embeddings:
            return None
        return self._param_name(kv_scale_param_name(name))

    def _param_name(self, name: str) -> tuple[str, object]:
        for fused, original, shard_id in self.stacked_params:
            if f".{original}." in name:
                return name.replace(f".{original}.", f".{fused}."), shard_id
        return name, None
