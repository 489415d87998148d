"""BERT encoders: ``BertModel`` (embeddings: all-MiniLM, BGE, E5) and
``BertForSequenceClassification`` (cross-encoder rerankers, classifiers).

Post-LayerNorm transformer layers with bidirectional attention over a
padding-free batch (``encoder_attention``): each input is one sequence of
the step's flat tokens and nothing is cached. Projections are the
tensor-parallel linear layers (q, k and v fused), so quantization methods
apply to them as to a decoder's. ``xlm_roberta.py`` reuses all of this with
RoBERTa's position numbering and classification head.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from octavo.errors import UnsupportedModelError
from octavo.models.base import ModelInitContext
from octavo.models.config import ModelArchConfig
from octavo.models.layers.attention import ForwardContext
from octavo.models.layers.embedding import VocabParallelEmbedding
from octavo.models.layers.encoder_attention import encoder_attention
from octavo.models.layers.linear import ColumnParallelLinear, QKVParallelLinear, ReplicatedLinear, RowParallelLinear
from octavo.models.pooling import PoolingMetadata, pool_modes
from octavo.models.weight_loading import check_all_loaded, load_named_tensors

# HF's activation names -> the function (exact erf GELU for "gelu", as HF).
ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}


def layer_norm_eps(config: ModelArchConfig) -> float:
    return float(config.raw.get("layer_norm_eps", 1e-12))


class BertEmbeddings(nn.Module):
    def __init__(self, ctx: ModelInitContext, position_offset: int) -> None:
        super().__init__()
        config = ctx.config
        if config.raw.get("position_embedding_type", "absolute") != "absolute":
            raise UnsupportedModelError(
                f"position_embedding_type {config.raw['position_embedding_type']!r} is not supported (absolute is)"
            )
        hidden = config.hidden_size
        self.position_offset = position_offset
        self.word_embeddings = VocabParallelEmbedding(config.vocab_size, hidden, ctx.dtype, "embeddings.word_embeddings")
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, hidden, dtype=ctx.dtype)
        self.token_type_embeddings = nn.Embedding(max(1, int(config.raw.get("type_vocab_size", 2))), hidden, dtype=ctx.dtype)
        self.LayerNorm = nn.LayerNorm(hidden, eps=layer_norm_eps(config), dtype=ctx.dtype)

    def forward(self, input_ids, positions, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        embeddings = self.word_embeddings(input_ids)
        if token_type_ids is None:
            embeddings = embeddings + self.token_type_embeddings.weight[0]
        else:
            embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        if self.position_offset:  # RoBERTa's; BERT's is 0, and adding it would be one more kernel
            positions = positions + self.position_offset
        embeddings = embeddings + self.position_embeddings(positions)
        return self.LayerNorm(embeddings)


class DenseAddNorm(nn.Module):
    """``LayerNorm(dense(x) + residual)``: BERT's attention and layer outputs."""

    def __init__(self, ctx: ModelInitContext, input_size: int, prefix: str) -> None:
        super().__init__()
        hidden = ctx.config.hidden_size
        self.dense = RowParallelLinear(
            input_size, hidden, bias=True, quant_config=ctx.quant_config, prefix=f"{prefix}.dense", params_dtype=ctx.dtype
        )
        self.LayerNorm = nn.LayerNorm(hidden, eps=layer_norm_eps(ctx.config), dtype=ctx.dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class BertAttention(nn.Module):
    def __init__(self, ctx: ModelInitContext, prefix: str) -> None:
        super().__init__()
        config = ctx.config
        self.head_size = config.hidden_size // config.num_attention_heads
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, self.head_size, config.num_attention_heads, config.num_attention_heads, bias=True,
            quant_config=ctx.quant_config, prefix=f"{prefix}.qkv_proj", params_dtype=ctx.dtype,
        )
        self.num_heads = self.qkv_proj.num_heads
        self.attention_op = ctx.ops.encoder_attention
        self.output = DenseAddNorm(ctx, config.hidden_size, f"{prefix}.output")

    def forward(self, hidden: torch.Tensor, fctx: ForwardContext) -> torch.Tensor:
        qkv = self.qkv_proj(hidden)
        out = encoder_attention(self.attention_op, qkv, self.num_heads, fctx.attn_metadata, self.head_size**-0.5)
        return self.output(out, hidden)


class BertIntermediate(nn.Module):
    def __init__(self, ctx: ModelInitContext, prefix: str) -> None:
        super().__init__()
        config = ctx.config
        if config.hidden_act not in ACTIVATIONS:
            raise UnsupportedModelError(f"hidden_act {config.hidden_act!r} is not supported ({', '.join(ACTIVATIONS)})")
        self.act_fn = ACTIVATIONS[config.hidden_act]
        self.dense = ColumnParallelLinear(
            config.hidden_size, [config.intermediate_size], bias=True, quant_config=ctx.quant_config,
            prefix=f"{prefix}.dense", params_dtype=ctx.dtype,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act_fn(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, ctx: ModelInitContext, prefix: str) -> None:
        super().__init__()
        self.attention = BertAttention(ctx, f"{prefix}.attention")
        self.intermediate = BertIntermediate(ctx, f"{prefix}.intermediate")
        self.output = DenseAddNorm(ctx, ctx.config.intermediate_size, f"{prefix}.output")

    def forward(self, hidden: torch.Tensor, fctx: ForwardContext) -> torch.Tensor:
        hidden = self.attention(hidden, fctx)
        return self.output(self.intermediate(hidden), hidden)


class BertEncoder(nn.Module):
    def __init__(self, ctx: ModelInitContext) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(ctx, f"encoder.layer.{i}") for i in range(ctx.config.num_hidden_layers))

    def forward(self, hidden: torch.Tensor, fctx: ForwardContext) -> torch.Tensor:
        for layer in self.layer:
            hidden = layer(hidden, fctx)
        return hidden


class BertModel(nn.Module):
    """The encoder, pooled as the checkpoint's sentence-transformers config says."""

    pooling_task: ClassVar[str] = "embed"
    is_encoder: ClassVar[bool] = True
    default_pooling_mode: ClassVar[str] = "cls"
    # The checkpoint's prefix when it was saved from a model with a head.
    checkpoint_prefix: ClassVar[str] = "bert."
    # Checkpoint tensors this class never uses (BertModel's pooler serves
    # only the classification head; MLM heads).
    unused_prefixes: ClassVar[tuple[str, ...]] = ("pooler.", "cls.", "lm_head.")
    stacked_params = (("qkv_proj", "self.query", "q"), ("qkv_proj", "self.key", "k"), ("qkv_proj", "self.value", "v"))

    def __init__(self, ctx: ModelInitContext) -> None:
        super().__init__()
        self.config = ctx.config
        self.embeddings = BertEmbeddings(ctx, self.position_offset(ctx.config))
        self.encoder = BertEncoder(ctx)
        pooler = ctx.pooler
        self.pooling_modes = list(pooler.pooling_modes) if pooler and pooler.pooling_modes else [self.default_pooling_mode]
        # torch's Embedding and LayerNorm make trainable parameters; this is inference.
        self.requires_grad_(False)

    @classmethod
    def position_offset(cls, config: ModelArchConfig) -> int:
        return 0

    @classmethod
    def max_input_len(cls, config: ModelArchConfig) -> int:
        return config.max_position_embeddings - cls.position_offset(config)

    def forward(self, input_ids, positions, fctx: ForwardContext, token_type_ids: torch.Tensor | None = None):
        return self.encoder(self.embeddings(input_ids, positions, token_type_ids), fctx)

    def pool(self, hidden: torch.Tensor, meta: PoolingMetadata) -> torch.Tensor:
        return pool_modes(hidden, meta, self.pooling_modes)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loaded = load_named_tensors(self, weights, self._rename)
        check_all_loaded(self, loaded, {"qkv_proj": ("q", "k", "v")})
        return loaded

    def _rename(self, name: str) -> tuple[str, object] | None:
        name = name.removeprefix(self.checkpoint_prefix)
        # Checkpoints from before transformers renamed LayerNorm's parameters.
        name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        if name.startswith(self.unused_prefixes):
            return None
        for fused, original, shard_id in self.stacked_params:
            if f".{original}." in name:
                return name.replace(f".{original}.", f".{fused}."), shard_id
        return name, None


class BertForSequenceClassification(BertModel):
    """CLS -> pooler (dense, tanh) -> classifier: one logit per label."""

    pooling_task: ClassVar[str] = "classify"
    unused_prefixes: ClassVar[tuple[str, ...]] = ("cls.", "lm_head.")

    def __init__(self, ctx: ModelInitContext) -> None:
        super().__init__(ctx)
        hidden, num_labels = ctx.config.hidden_size, ctx.pooler.output_size
        self.pooler = nn.Module()
        self.pooler.dense = ReplicatedLinear(hidden, hidden, bias=True, prefix="pooler.dense", params_dtype=ctx.dtype)
        self.classifier = ReplicatedLinear(hidden, num_labels, bias=True, prefix="classifier", params_dtype=ctx.dtype)

    def pool(self, hidden: torch.Tensor, meta: PoolingMetadata) -> torch.Tensor:
        pooled = torch.tanh(self.pooler.dense(hidden[meta.first_rows]))
        return self.classifier(pooled).float()
