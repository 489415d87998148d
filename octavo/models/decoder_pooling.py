"""Decoders as pooling models.

- Embedders: a causal LM checkpoint served with ``--task embed`` (or one that
  carries a sentence-transformers pipeline, as Qwen3-Embedding's
  ``Qwen3ForCausalLM`` does) pools its final hidden states, by default at
  the last token, as ``as_embedding_model(causal_class)``.
- Sequence classifiers (``Qwen2ForSequenceClassification`` and friends): the
  last token's hidden state through a linear ``score`` layer, one logit per
  label. Inputs are never padded, so "the last token" is the last input
  token (Hugging Face looks for the last non-padding token instead, which
  is the same for any input that does not itself end in the padding id).

The decoder is the causal LM's own (attention backend, paged KV cache), built
without its LM head; a pooling request is computed in one step and its KV
blocks are freed when it finishes. Checkpoints saved from the bare decoder
(names without ``model.``, as Qwen3-Embedding's) load too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import cache
from typing import ClassVar

import torch

from octavo.models.base import ModelInitContext
from octavo.models.layers.linear import ReplicatedLinear
from octavo.models.llama import LlamaForCausalLM
from octavo.models.pooling import PoolingMetadata, pool_modes
from octavo.models.qwen2 import Qwen2ForCausalLM
from octavo.models.qwen3 import Qwen3ForCausalLM

# Top-level names of a *ForCausalLM / *ForSequenceClassification checkpoint;
# anything else belongs to the bare decoder and is put under ``model.``.
_TOP_LEVEL = ("model.", "lm_head.", "score.")


def _under_model(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in weights:
        if name.startswith("lm_head."):
            continue  # an embedder's or classifier's checkpoint may keep the LM head; it is unused
        yield (name if name.startswith(_TOP_LEVEL) else f"model.{name}"), tensor


class DecoderPooling:
    """Mixed in before a ``LlamaForCausalLM`` subclass: no LM head, ``pool``."""

    is_encoder: ClassVar[bool] = False
    default_pooling_mode: ClassVar[str] = "lasttoken"
    has_lm_head = False

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights(_under_model(weights))

    @classmethod
    def max_input_len(cls, config) -> int:
        return config.max_position_embeddings


class DecoderEmbedder(DecoderPooling):
    pooling_task: ClassVar[str] = "embed"

    def __init__(self, ctx: ModelInitContext) -> None:
        super().__init__(ctx)
        pooler = ctx.pooler
        self.pooling_modes = list(pooler.pooling_modes) if pooler and pooler.pooling_modes else [self.default_pooling_mode]

    def pool(self, hidden: torch.Tensor, meta: PoolingMetadata) -> torch.Tensor:
        return pool_modes(hidden, meta, self.pooling_modes)


class DecoderClassifier(DecoderPooling):
    pooling_task: ClassVar[str] = "classify"

    def __init__(self, ctx: ModelInitContext) -> None:
        super().__init__(ctx)
        self.score = ReplicatedLinear(
            ctx.config.hidden_size, ctx.pooler.output_size, bias=False, prefix="score", params_dtype=ctx.dtype
        )

    def pool(self, hidden: torch.Tensor, meta: PoolingMetadata) -> torch.Tensor:
        return self.score(hidden[meta.last_rows]).float()


@cache
def as_embedding_model(causal_class: type) -> type:
    """``causal_class`` (a LlamaForCausalLM subclass) as an embedder."""
    return type(f"{causal_class.__name__}Embedder", (DecoderEmbedder, causal_class), {"__module__": __name__})


class LlamaForSequenceClassification(DecoderClassifier, LlamaForCausalLM):
    pass


class Qwen2ForSequenceClassification(DecoderClassifier, Qwen2ForCausalLM):
    pass


class Qwen3ForSequenceClassification(DecoderClassifier, Qwen3ForCausalLM):
    pass
