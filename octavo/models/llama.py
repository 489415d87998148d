"""The Llama decoder, and every family that shares its shape.

Llama 2/3/3.1 and Mistral are this class as is; the other families set a
few hooks (``DecoderOptions``, built by ``decoder_options``) rather than
copying it: biases on q/k/v (Qwen2), q/k RMSNorm per head (Qwen3, Gemma 3)
or over all heads (OLMo 2, OLMoE), the norm's rounding (Gemma, OLMo 2) or
kind (LayerNorm: StarCoder 2, Cohere), the layer's norm placement
(pre-norm; Gemma's sandwich of four norms; OLMo 2's post-norms; Cohere's
attention and MLP in parallel), attention scale and logit soft-capping,
multipliers (Granite, Cohere's logit scale),
RoPE over interleaved pairs (ERNIE 4.5), or none at all in the layers the
config names (SmolLM3's NoPE layers, ``config.nope_layers``),
and the MLP of each layer (``build_mlp``: a dense SwiGLU/GeGLU MLP, an
ungated one (StarCoder 2) or a mixture of experts). Projections are fused
(qkv, gate-up) and split across tensor-parallel ranks by their weight
loaders (``models/weights.py``).

Every layer returns ``(delta, residual)``: the residual stream after the
layer is ``delta + residual``, so that the next layer's first norm can fuse
the add (and pipeline stages hand the pair on as is). Gemma's sandwich
layers go one step further: handed the norm that follows them, they return
its output and the stream itself (``DecoderModel.next_norms``).
Every layer computes through the layer ops resolved for this model
(``ctx.ops``; the layers take them from the scope the builder opens).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from octavo.core.attention import AttentionSpec
from octavo.distributed.parallel_state import get_pp_group
from octavo.models.aux_hidden import AuxHiddenStates
from octavo.models.base import ModelInitContext
from octavo.models.layers.attention import Attention, ForwardContext, attention_sinks_param
from octavo.models.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from octavo.models.layers.layer_norm import HeadLayerNorm, LayerNorm
from octavo.models.layers.linear import QKVParallelLinear, RowParallelLinear
from octavo.models.layers.mlp import DecoderMLP
from octavo.models.layers.norm import (
    Float32ScaleRMSNorm, RMSNorm, feeds_fp8_linear, feeds_linear, feeds_router, fuses_with, post_norm_add_norm,
)
from octavo.models.layers.qk_norm import ShardedRMSNorm
from octavo.models.layers.rotary import InterleavedRotaryEmbedding, RotaryEmbedding
from octavo.models.weights import load_decoder_weights


@dataclass(frozen=True)
class DecoderOptions:
    """How a family's decoder differs from Llama's."""

    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: str | None = None  # "head": each head (Qwen3, Gemma 3); "full": all heads at once (OLMo);
    # "head_layer": LayerNorm of each head by a weight per head (Cohere)
    norm_in_float32: bool = False  # scale in float32 before casting back (Gemma, OLMo 2)
    norm_weight_offset: float = 0.0  # Gemma scales by 1 + weight
    # "rms"; "layer" / "layer_bias": LayerNorm without / with a bias (Cohere / StarCoder 2)
    norm_kind: str = "rms"
    norm_eps: float | None = None  # None: config.rms_norm_eps (LayerNorm families name theirs otherwise)
    # "pre_norm", "sandwich" (Gemma 2/3), "post_norm" (OLMo 2) or "parallel"
    # (Cohere: attention and MLP side by side on one norm's output)
    layer_kind: str = "pre_norm"
    attention_scale: float | None = None  # None: head_size ** -0.5
    attn_soft_cap: float | None = None
    clip_qkv: float | None = None  # OLMoE clamps q, k and v
    rope_interleaved: bool = False  # RoPE over pairs (x[2i], x[2i+1]) (ERNIE 4.5), not halves
    attention_sinks: bool = False  # a learned logit per head joins each softmax (gpt-oss's ``self_attn.sinks``)
    embed_scale: float = 1.0
    residual_scale: float = 1.0  # Granite scales each block's output
    final_soft_cap: float | None = None  # Gemma 2 caps the logits
    logits_divisor: float = 1.0  # Granite divides the logits
    logits_scale: float = 1.0  # Cohere multiplies them (``logit_scale``)
    # The attention module's class (ctx, options, layer_index, prefix); None:
    # DecoderAttention (DeepSeek brings its latent attention).
    attention: Callable[..., nn.Module] | None = None

    def make_attention(self, ctx: ModelInitContext, layer_index: int, prefix: str) -> nn.Module:
        return (self.attention or DecoderAttention)(ctx, self, layer_index, prefix)

    def eps(self, config) -> float:
        return config.rms_norm_eps if self.norm_eps is None else self.norm_eps

    def norm(self, ctx: ModelInitContext, size: int) -> nn.Module:
        eps = self.eps(ctx.config)
        if self.norm_kind != "rms":
            return LayerNorm(size, eps, ctx.dtype, bias=self.norm_kind == "layer_bias")
        if self.norm_in_float32:
            return Float32ScaleRMSNorm(size, eps, ctx.dtype, self.norm_weight_offset)
        return RMSNorm(size, eps, ctx.dtype)


class DecoderAttention(nn.Module):
    def __init__(self, ctx: ModelInitContext, options: DecoderOptions, layer_index: int, prefix: str):
        super().__init__()
        config = ctx.config
        self.head_size = config.head_dim
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, self.head_size, config.num_attention_heads, config.num_key_value_heads,
            bias=options.qkv_bias, quant_config=ctx.quant_config, prefix=f"{prefix}.qkv_proj", params_dtype=ctx.dtype,
        )
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = self.num_heads * self.head_size, self.num_kv_heads * self.head_size
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * self.head_size, config.hidden_size, bias=options.o_bias,
            quant_config=ctx.quant_config, prefix=f"{prefix}.o_proj", params_dtype=ctx.dtype,
        )
        self.qk_norm, self.clip_qkv = options.qk_norm, options.clip_qkv
        self.q_norm = self.k_norm = None
        if options.qk_norm == "head":
            self.q_norm, self.k_norm = options.norm(ctx, self.head_size), options.norm(ctx, self.head_size)
            # Both norms in one op (one launch where the platform has it); the
            # modules hold the weights and say how to round (Gemma's offset).
            self.head_norms_op = ctx.ops.qk_rms_norm
        elif options.qk_norm == "full":
            eps, f32 = config.rms_norm_eps, options.norm_in_float32
            self.q_norm = ShardedRMSNorm(config.num_attention_heads * self.head_size, eps, ctx.dtype, f32)
            kv_total = config.num_key_value_heads * self.head_size
            self.k_norm = ShardedRMSNorm(kv_total, eps, ctx.dtype, f32, num_replicas=self.qkv_proj.kv_replicas)
        elif options.qk_norm == "head_layer":
            eps, replicas = options.eps(config), self.qkv_proj.kv_replicas
            self.q_norm = HeadLayerNorm(config.num_attention_heads, self.head_size, eps, ctx.dtype)
            self.k_norm = HeadLayerNorm(config.num_key_value_heads, self.head_size, eps, ctx.dtype, replicas)
        window = config.sliding_windows[layer_index]
        theta, rope = config.rope_theta, config.rope_parameters
        if window is not None and config.local_rope_theta is not None:  # Gemma 3's and OLMo 3's local layers
            theta, rope = config.local_rope_theta, config.local_rope_parameters
        # None: a NoPE layer (SmolLM3), whose q and k are never rotated.
        rotary = InterleavedRotaryEmbedding if options.rope_interleaved else RotaryEmbedding
        nope = layer_index in config.nope_layers
        self.rotary_emb = None if nope else rotary(
            self.head_size, ctx.max_model_len, theta, rope, rotary_dim=config.rotary_dim  # < head_size: partial rotary
        )
        spec = AttentionSpec(
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_size=self.head_size,
            scale=options.attention_scale or self.head_size**-0.5,
            dtype=ctx.dtype,
            kv_cache_dtype=ctx.kv_cache_dtype,
            block_size=ctx.block_size,
            sliding_window=window,
            logits_soft_cap=options.attn_soft_cap,
            sinks=options.attention_sinks,
        )
        self.attn = Attention(ctx.attention_backend(spec), layer_index)
        self.sinks = attention_sinks_param(self.num_heads) if options.attention_sinks else None

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, fctx: ForwardContext) -> torch.Tensor:
        return self.attend(positions, self.qkv_proj(hidden), fctx)

    def attend(self, positions: torch.Tensor, qkv: torch.Tensor, fctx: ForwardContext) -> torch.Tensor:
        """The block after the qkv projection (``qkv``: its output), through ``o_proj``."""
        num_tokens = qkv.shape[0]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.qk_norm == "full":
            q, k = self.q_norm(q), self.k_norm(k)
        if self.clip_qkv is not None:
            q, k, v = (t.clamp(-self.clip_qkv, self.clip_qkv) for t in (q, k, v))
        q = q.reshape(num_tokens, self.num_heads, self.head_size)
        k = k.reshape(num_tokens, self.num_kv_heads, self.head_size)
        if self.qk_norm == "head":
            offset = getattr(self.q_norm, "weight_offset", None)  # Float32ScaleRMSNorm's; None: Llama's rounding
            q, k = self.head_norms_op(q, k, self.q_norm.weight, self.k_norm.weight, self.q_norm.eps, offset)
        elif self.qk_norm == "head_layer":
            q, k = self.q_norm(q), self.k_norm(k)
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_size)
        out = self.attn(q, k, v, fctx, positions=positions, rotary=self.rotary_emb, sinks=self.sinks)
        return self.o_proj(out)


class DecoderLayer(nn.Module):
    """Pre-norm (Llama): norm -> attention -> add; norm -> MLP -> add."""

    def __init__(self, ctx: ModelInitContext, options: DecoderOptions, mlp: nn.Module, layer_index: int, prefix: str):
        super().__init__()
        hidden = ctx.config.hidden_size
        self.self_attn = options.make_attention(ctx, layer_index, f"{prefix}.self_attn")
        self.mlp = mlp
        self.input_layernorm = options.norm(ctx, hidden)
        self.post_attention_layernorm = options.norm(ctx, hidden)
        self.residual_scale = options.residual_scale
        # Each norm and the projection it feeds are one op where they can be:
        # an fp8 projection's quantizer in the norm's pass
        # (``RMSNorm.add_then_fp8_linear``), the norm inside an unquantized
        # qkv projection's decode GEMV (``add_then_linear``), a MoE layer's
        # norm, router and top-k (``add_then_route``).
        qkv_proj = self.self_attn.qkv_proj if isinstance(self.self_attn, DecoderAttention) else None
        self.fp8_qkv = qkv_proj is not None and feeds_fp8_linear(self.input_layernorm, qkv_proj)
        self.norm_qkv = qkv_proj is not None and feeds_linear(self.input_layernorm, qkv_proj)
        self.fp8_gate_up = isinstance(mlp, DecoderMLP) and feeds_fp8_linear(
            self.post_attention_layernorm, mlp.gate_up_proj
        )
        self.norm_route = feeds_router(self.post_attention_layernorm, mlp)

    def input_norm(self, hidden, residual):
        """The first norm, with the previous layer's residual add fused in."""
        if residual is None:
            return self.input_layernorm(hidden), hidden
        return self.input_layernorm(hidden, residual)

    def forward(self, positions, hidden, residual, fctx: ForwardContext):
        if (self.fp8_qkv or self.norm_qkv) and residual is not None:
            norm = self.input_layernorm
            fused = norm.add_then_fp8_linear if self.fp8_qkv else norm.add_then_linear
            qkv, residual = fused(hidden, residual, self.self_attn.qkv_proj)
            hidden = self.self_attn.attend(positions, qkv, fctx)
        else:
            hidden, residual = self.input_norm(hidden, residual)
            hidden = self.self_attn(positions, hidden, fctx)
        if self.residual_scale != 1.0:
            hidden = hidden * self.residual_scale
        if self.fp8_gate_up:
            gate_up, residual = self.post_attention_layernorm.add_then_fp8_linear(hidden, residual, self.mlp.gate_up_proj)
            hidden = self.mlp.after_gate_up(gate_up)
        elif self.norm_route:
            mlp = self.mlp
            weights, ids, hidden, residual = self.post_attention_layernorm.add_then_route(
                hidden, residual, mlp.gate.weight, mlp.top_k, mlp.renormalize
            )
            hidden = mlp.after_route(hidden, weights, ids)
        else:
            hidden, residual = self.post_attention_layernorm(hidden, residual)
            hidden = self.mlp(hidden)
        if self.residual_scale != 1.0:
            hidden = hidden * self.residual_scale
        return hidden, residual


class SandwichDecoderLayer(DecoderLayer):
    """Gemma 2/3: norms before and after both attention and MLP.

    A block's norm, the residual add and the next block's norm are one op
    (``post_norm_add_norm``): after attention within the layer; after the
    MLP across the boundary when the model hands in the norm that follows
    (``next_norm``: the next layer's input norm, or the final norm). The
    layer then returns that norm's output and the residual stream, and the
    next layer is called with ``normed=True``."""

    fuses_next_norm = True

    def __init__(self, ctx: ModelInitContext, options: DecoderOptions, mlp: nn.Module, layer_index: int, prefix: str):
        super().__init__(ctx, options, mlp, layer_index, prefix)
        self.pre_feedforward_layernorm = options.norm(ctx, ctx.config.hidden_size)
        self.post_feedforward_layernorm = options.norm(ctx, ctx.config.hidden_size)

    def forward(self, positions, hidden, residual, fctx: ForwardContext, next_norm=None, normed: bool = False):
        if not normed:
            hidden, residual = self.input_norm(hidden, residual)
        attn_out = self.self_attn(positions, hidden, fctx)
        post, pre = self.post_attention_layernorm, self.pre_feedforward_layernorm
        hidden, residual = post_norm_add_norm(post, attn_out, residual, pre)
        mlp_out = self.mlp(hidden)
        if next_norm is None:
            return self.post_feedforward_layernorm(mlp_out), residual
        return post_norm_add_norm(self.post_feedforward_layernorm, mlp_out, residual, next_norm)


class PostNormDecoderLayer(nn.Module):
    """OLMo 2: attention -> norm -> add; MLP -> norm -> add (no input norms)."""

    def __init__(self, ctx: ModelInitContext, options: DecoderOptions, mlp: nn.Module, layer_index: int, prefix: str):
        super().__init__()
        hidden = ctx.config.hidden_size
        self.self_attn = options.make_attention(ctx, layer_index, f"{prefix}.self_attn")
        self.mlp = mlp
        self.post_attention_layernorm = options.norm(ctx, hidden)
        self.post_feedforward_layernorm = options.norm(ctx, hidden)

    def forward(self, positions, hidden, residual, fctx: ForwardContext):
        stream = hidden if residual is None else hidden + residual
        stream = stream + self.post_attention_layernorm(self.self_attn(positions, stream, fctx))
        return self.post_feedforward_layernorm(self.mlp(stream)), stream


class ParallelDecoderLayer(nn.Module):
    """Cohere: one norm, then attention and MLP side by side on its output;
    both blocks' outputs join the residual stream together."""

    def __init__(self, ctx: ModelInitContext, options: DecoderOptions, mlp: nn.Module, layer_index: int, prefix: str):
        super().__init__()
        self.self_attn = options.make_attention(ctx, layer_index, f"{prefix}.self_attn")
        self.mlp = mlp
        self.input_layernorm = options.norm(ctx, ctx.config.hidden_size)

    input_norm = DecoderLayer.input_norm  # the same first norm, previous residual add fused in

    def forward(self, positions, hidden, residual, fctx: ForwardContext):
        normed, residual = self.input_norm(hidden, residual)
        return self.self_attn(positions, normed, fctx) + self.mlp(normed), residual


LAYER_KINDS = {
    "pre_norm": DecoderLayer, "sandwich": SandwichDecoderLayer, "post_norm": PostNormDecoderLayer,
    "parallel": ParallelDecoderLayer,
}


def layer_range(num_layers: int) -> tuple[int, int]:
    """The layers this pipeline-parallel rank holds (earlier ranks take the remainder)."""
    pp = get_pp_group()
    base, extra = divmod(num_layers, pp.world_size)
    start = pp.rank * base + min(pp.rank, extra)
    return start, start + base + (1 if pp.rank < extra else 0)


MlpFactory = Callable[[ModelInitContext, int, str], nn.Module]


class DecoderModel(AuxHiddenStates, nn.Module):
    def __init__(self, ctx: ModelInitContext, options: DecoderOptions, build_mlp: MlpFactory):
        super().__init__()
        config = ctx.config
        self.start_layer, self.end_layer = layer_range(config.num_hidden_layers)
        self.embed_scale = options.embed_scale
        pp = get_pp_group()
        self.embed_tokens = (
            VocabParallelEmbedding(config.vocab_size, config.hidden_size, ctx.dtype, "model.embed_tokens")
            if pp.is_first or config.tie_word_embeddings
            else None
        )
        layer_class = LAYER_KINDS[options.layer_kind]
        # Layers outside this rank's range are absent (Identity keeps indices stable).
        self.layers = nn.ModuleList(
            [
                layer_class(ctx, options, build_mlp(ctx, i, f"model.layers.{i}.mlp"), i, f"model.layers.{i}")
                if self.start_layer <= i < self.end_layer
                else nn.Identity()
                for i in range(config.num_hidden_layers)
            ]
        )
        self.norm = options.norm(ctx, config.hidden_size) if pp.is_last else None
        # A plain list, not submodules: these norms are registered where they live.
        self.next_norms = self._next_norms()

    def _next_norms(self) -> list[nn.Module | None]:
        """Per local layer, the norm that follows it when the layer fuses it in
        (``fuses_next_norm``): the next layer's input norm, or the final norm
        on the last rank. None where the pair goes on as ``(delta, residual)``:
        other layer kinds, the last layer of an earlier pipeline stage."""
        local = list(self.layers[self.start_layer : self.end_layer])
        fuses = [getattr(layer, "fuses_next_norm", False) for layer in local]
        # Only between fusing layers: the next one must take ``normed=True``.
        pairs = zip(local[1:], fuses, fuses[1:])
        follows = [nxt.input_layernorm if fused and fuses_next else None for nxt, fused, fuses_next in pairs]
        return [
            norm if fused and fuses_with(layer.post_feedforward_layernorm, norm) else None
            for layer, norm, fused in zip(local, follows + [self.norm], fuses)
        ]

    def forward(self, input_ids, positions, fctx: ForwardContext, intermediate=None, inputs_embeds=None):
        """First PP rank: embed ``input_ids``, or take ``inputs_embeds`` ([T, hidden]:
        the rows as the first layer reads them, a multimodal model's mix of token
        and image embeddings); other ranks continue ``intermediate`` (hidden,
        residual). Last rank returns normed hidden states."""
        if intermediate is not None:
            hidden, residual = intermediate
        elif inputs_embeds is not None:
            hidden, residual = inputs_embeds, None
        else:
            hidden, residual = self.embed_tokens(input_ids), None
            if self.embed_scale != 1.0:
                hidden = hidden * self.embed_scale
        normed = False  # whether ``hidden`` is already the next norm's output
        local = zip(self.layers[self.start_layer : self.end_layer], self.next_norms)
        for index, (layer, next_norm) in enumerate(local, start=self.start_layer):
            if self.aux_slots:
                self._keep_aux(index, hidden, residual, normed)
            if next_norm is None and not normed:
                hidden, residual = layer(positions, hidden, residual, fctx)
            else:
                hidden, residual = layer(positions, hidden, residual, fctx, next_norm=next_norm, normed=normed)
            normed = next_norm is not None
        if self.aux_slots:
            self._keep_aux(len(self.layers), hidden, residual, normed)
        if self.norm is None:
            return hidden, residual
        if not normed:
            hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    # Checkpoint name fragments renamed before anything else (Mixtral's
    # ``block_sparse_moe`` is this decoder's ``mlp``).
    checkpoint_renames: tuple[tuple[str, str], ...] = ()
    # Pooling variants (decoder_pooling.py) are built without the LM head.
    has_lm_head = True

    @classmethod
    def decoder_options(cls, config, dtype: torch.dtype) -> DecoderOptions:
        return DecoderOptions(qkv_bias=config.attention_bias, o_bias=config.attention_bias)

    def build_mlp(self, ctx: ModelInitContext, layer_index: int, prefix: str) -> nn.Module:
        return DecoderMLP(ctx, prefix)

    def __init__(self, ctx: ModelInitContext) -> None:
        super().__init__()
        config = ctx.config
        self.config = config
        self.options = self.decoder_options(config, ctx.dtype)
        self.model = DecoderModel(ctx, self.options, self.build_mlp)
        self.lm_head = None
        if get_pp_group().is_last and self.has_lm_head:
            tie = self.model.embed_tokens if config.tie_word_embeddings else None
            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, ctx.dtype, "lm_head", tie_to=tie)

    def forward(self, input_ids, positions, fctx: ForwardContext, intermediate=None, inputs_embeds=None):
        return self.model(input_ids, positions, fctx, intermediate, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head.compute_logits(hidden_states)
        if self.options.logits_divisor != 1.0:
            logits = logits / self.options.logits_divisor
        if self.options.logits_scale != 1.0:
            logits = logits * self.options.logits_scale
        cap = self.options.final_soft_cap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy checkpoint tensors into parameters; raise on missing ones."""
        return load_decoder_weights(self, weights)
