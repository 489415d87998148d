"""XLM-RoBERTa encoders: ``XLMRobertaModel`` (multilingual-e5, bge-m3) and
``XLMRobertaForSequenceClassification`` (bge-reranker).

BERT's encoder (``bert.py``) with RoBERTa's two differences: positions are
numbered from ``pad_token_id + 1`` (HF counts the non-padding tokens after
the padding index, so an unpadded input of n tokens uses positions
``pad + 1 .. pad + n``), and the classification head reads the first token
through its own dense + tanh layer (there is no BERT pooler).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from octavo.models.base import ModelInitContext
from octavo.models.bert import BertModel
from octavo.models.config import ModelArchConfig
from octavo.models.layers.linear import ReplicatedLinear
from octavo.models.pooling import PoolingMetadata


class XLMRobertaModel(BertModel):
    checkpoint_prefix: ClassVar[str] = "roberta."

    @classmethod
    def position_offset(cls, config: ModelArchConfig) -> int:
        return int(config.raw.get("pad_token_id", 1)) + 1


class XLMRobertaForSequenceClassification(XLMRobertaModel):
    """First token -> dense, tanh -> out_proj: one logit per label."""

    pooling_task: ClassVar[str] = "classify"
    unused_prefixes: ClassVar[tuple[str, ...]] = ("lm_head.",)

    def __init__(self, ctx: ModelInitContext) -> None:
        super().__init__(ctx)
        hidden, num_labels = ctx.config.hidden_size, ctx.pooler.output_size
        self.classifier = nn.Module()
        self.classifier.dense = ReplicatedLinear(hidden, hidden, bias=True, prefix="classifier.dense", params_dtype=ctx.dtype)
        self.classifier.out_proj = ReplicatedLinear(
            hidden, num_labels, bias=True, prefix="classifier.out_proj", params_dtype=ctx.dtype
        )

    def pool(self, hidden: torch.Tensor, meta: PoolingMetadata) -> torch.Tensor:
        features = torch.tanh(self.classifier.dense(hidden[meta.first_rows]))
        return self.classifier.out_proj(features).float()
