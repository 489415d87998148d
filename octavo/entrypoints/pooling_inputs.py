"""Inputs of pooling requests, shared by ``LLM`` and the HTTP routes.

Texts are tokenized the way the model was trained to read them: in one
batched tokenizer call (straight to the ``tokenizers`` library where that
gives transformers' ids: ``encode_batch_ids``), lowercased when sentence-transformers says so, a
text pair (cross-encoder scoring) as the tokenizer joins pairs, with BERT's
segment ids when they are not all zero. Nothing is truncated unless
``truncate_prompt_tokens`` asks (-1: to the model's limit); an input that is
too long is then refused by the engine's validation (HTTP 400).

Scoring pairs: ``text_1`` is one text or a list, ``text_2`` the same; one
text against many is broadcast, two lists must be as long as each other.
A ``ScorePlan`` says which inputs to pool and how their vectors become the
pairs' scores (cross-encoder, or a bi-encoder's similarity: cosine unless
the sentence-transformers config names dot, euclidean or manhattan).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from octavo.core.pooling_params import PoolerConfig
from octavo.core.tokenizer import encode_batch_ids, single_types_are_zero
from octavo.errors import InvalidArgumentError, UnsupportedTaskError


@dataclass
class PoolingInput:
    """One input: ``text`` is None for token ids; ``token_type_ids`` None means all zero."""

    text: str | None
    token_ids: list[int]
    token_type_ids: list[int] | None = None

    def as_engine_prompt(self) -> dict:
        prompt: dict[str, Any] = {"prompt": self.text, "prompt_token_ids": self.token_ids}
        if self.token_type_ids is not None:
            prompt["token_type_ids"] = self.token_type_ids
        return prompt


@dataclass
class PoolingColumns:
    """Inputs as columns (entry ``i`` of each list is input ``i``): a batch of
    texts goes from the tokenizer to the engine's ``PoolingBatch`` without an
    object per input (hundreds of short sentences a call)."""

    texts: list[str | None]
    token_ids: list[list[int]]
    token_type_ids: list[list[int] | None]

    def __len__(self) -> int:
        return len(self.token_ids)

    def inputs(self) -> list[PoolingInput]:
        return [PoolingInput(*row) for row in zip(self.texts, self.token_ids, self.token_type_ids)]

    @classmethod
    def of(cls, inputs: Sequence[PoolingInput]) -> PoolingColumns:
        return cls([i.text for i in inputs], [i.token_ids for i in inputs], [i.token_type_ids for i in inputs])


def truncation_length(truncate_prompt_tokens: int | None, max_model_len: int) -> int | None:
    """How many tokens to keep (None: keep all); -1 means the model's limit."""
    if truncate_prompt_tokens is None:
        return None
    if isinstance(truncate_prompt_tokens, bool) or not isinstance(truncate_prompt_tokens, int):
        raise InvalidArgumentError("truncate_prompt_tokens must be an integer", param="truncate_prompt_tokens")
    if truncate_prompt_tokens == -1:
        return max_model_len
    if not 1 <= truncate_prompt_tokens <= max_model_len:
        raise InvalidArgumentError(
            f"truncate_prompt_tokens must be -1 or in [1, {max_model_len}], got {truncate_prompt_tokens}",
            param="truncate_prompt_tokens",
        )
    return truncate_prompt_tokens


def encode_texts(
    tokenizer: Any, pooler: PoolerConfig, texts: Sequence[str], pairs: Sequence[str] | None = None,
    truncate: int | None = None,
) -> list[PoolingInput]:
    """Tokenize ``texts`` (or the pairs ``(texts[i], pairs[i])``) in one call."""
    return encode_text_columns(tokenizer, pooler, texts, pairs, truncate).inputs()


def encode_text_columns(
    tokenizer: Any, pooler: PoolerConfig, texts: Sequence[str], pairs: Sequence[str] | None = None,
    truncate: int | None = None,
) -> PoolingColumns:
    """``encode_texts`` as columns."""
    if tokenizer is None:
        raise InvalidArgumentError("this engine has no tokenizer; send token ids", param="input")
    if any(not isinstance(t, str) for t in [*texts, *(pairs or [])]):
        raise InvalidArgumentError("every input must be a string", param="input")
    if pooler.lowercase:
        texts = [t.lower() for t in texts]
        pairs = [t.lower() for t in pairs] if pairs is not None else None
    # The segment ids transformers' call returns: asked for, or named by the tokenizer.
    with_types = pooler.num_token_types > 1 or "token_type_ids" in getattr(tokenizer, "model_input_names", ())
    encoded = None
    if truncate is None:
        batch = list(texts) if pairs is None else list(zip(texts, pairs))
        # Segment ids known to be all zero are not made only to be dropped below.
        encoded = encode_batch_ids(tokenizer, batch, with_types and (pairs is not None or not single_types_are_zero(tokenizer)))
    if encoded is None:
        encoded = _encode_with_transformers(tokenizer, pooler, texts, pairs, truncate)
    id_lists, type_lists = encoded
    shown = texts if pairs is None else [f"{a}\n{b}" for a, b in zip(texts, pairs)]
    # The lists are this call's own (the tokenizer's output), unless another type.
    id_lists = [ids if type(ids) is list else list(ids) for ids in id_lists]
    types = [None] * len(id_lists)
    if type_lists is not None:  # segment ids kept only where some are not 0
        types = [list(t) if t is not None and any(t) else None for t in type_lists]
    return PoolingColumns(list(shown), id_lists, types)


def _encode_with_transformers(
    tokenizer: Any, pooler: PoolerConfig, texts: Sequence[str], pairs: Sequence[str] | None, truncate: int | None
) -> tuple[list[list[int]], list[list[int]] | None]:
    """The tokenizer's own call: for truncation, and tokenizers ``encode_batch_ids`` cannot stand in for."""
    options: dict[str, Any] = {"add_special_tokens": True, "return_attention_mask": False}
    if truncate is not None:
        options.update(truncation="longest_first" if pairs is not None else True, max_length=truncate)
    if pooler.num_token_types > 1:
        options["return_token_type_ids"] = True
    encoded = tokenizer(list(texts), list(pairs), **options) if pairs is not None else tokenizer(list(texts), **options)
    return encoded["input_ids"], encoded.get("token_type_ids")


def token_inputs(token_lists: Sequence[Sequence[int]], truncate: int | None, tokenizer: Any = None) -> list[PoolingInput]:
    """Token-id inputs, cut to ``truncate`` tokens on the tokenizer's truncation side (the right by default)."""
    keep_left = getattr(tokenizer, "truncation_side", "right") == "left"
    inputs = []
    for ids in token_lists:
        ids = list(ids)
        if truncate is not None and len(ids) > truncate:
            ids = ids[-truncate:] if keep_left else ids[:truncate]
        inputs.append(PoolingInput(None, ids))
    return inputs


def score_pairs(text_1: str | Sequence[str], text_2: str | Sequence[str]) -> list[tuple[str, str]]:
    """The (text_1, text_2) pairs to score: 1 x N, N x 1 or N x N."""
    left = [text_1] if isinstance(text_1, str) else list(text_1)
    right = [text_2] if isinstance(text_2, str) else list(text_2)
    if not left or not right:
        raise InvalidArgumentError("nothing to score: text_1 and text_2 must not be empty", param="text_1")
    if len(left) == 1:
        left = left * len(right)
    elif len(right) == 1:
        right = right * len(left)
    elif len(left) != len(right):
        raise InvalidArgumentError(
            f"text_1 has {len(left)} texts and text_2 has {len(right)}: give one text on a side, or as many on both",
            param="text_2",
        )
    return list(zip(left, right))


def check_can_score(pooler: PoolerConfig | None) -> None:
    """Scoring needs a one-label cross-encoder or an embedding model."""
    if pooler is None:
        raise UnsupportedTaskError(
            "this model generates text; scoring needs an embedding model or a cross-encoder", param="model"
        )
    if pooler.task == "classify" and pooler.output_size != 1:
        raise UnsupportedTaskError(
            f"scoring needs a cross-encoder with one label; this classifier has {pooler.output_size}", param="model"
        )


@dataclass
class ScorePlan:
    """How to score text pairs: a cross-encoder classifies each pair (its
    score is the one activated logit); a bi-encoder embeds each distinct text
    once and scores a pair by the cosine of its two embeddings."""

    pairs: list[tuple[str, str]]
    cross_encoder: bool
    inputs: list[PoolingInput]
    # Bi-encoder: the positions in ``inputs`` of each pair's two texts, and
    # the model's similarity (sentence-transformers' similarity_fn_name).
    pair_inputs: list[tuple[int, int]]
    similarity: str = "cosine"

    @property
    def task(self) -> str:
        return "classify" if self.cross_encoder else "embed"

    def scores(self, vectors: Sequence[Sequence[float]]) -> list[float]:
        """Each pair's score, from the vectors of ``inputs`` (in order)."""
        if self.cross_encoder:
            return [float(vector[0]) for vector in vectors]
        matrix = np.asarray(vectors, dtype=np.float64)
        first, second = (matrix[[pair[k] for pair in self.pair_inputs]] for k in (0, 1))
        if self.similarity == "dot":
            return (first * second).sum(1).tolist()
        if self.similarity == "euclidean":
            return (-np.linalg.norm(first - second, axis=1)).tolist()
        if self.similarity == "manhattan":
            return (-np.abs(first - second).sum(1)).tolist()
        norms = np.maximum(np.linalg.norm(first, axis=1) * np.linalg.norm(second, axis=1), 1e-12)
        return ((first * second).sum(1) / norms).tolist()

    def pair_token_ids(self, index: int) -> list[int]:
        if self.cross_encoder:
            return self.inputs[index].token_ids
        first, second = self.pair_inputs[index]
        return self.inputs[first].token_ids + self.inputs[second].token_ids


def plan_scores(
    tokenizer: Any, pooler: PoolerConfig | None, pairs: list[tuple[str, str]], truncate: int | None
) -> ScorePlan:
    check_can_score(pooler)
    if pooler.task == "classify":
        inputs = encode_texts(tokenizer, pooler, [a for a, _ in pairs], [b for _, b in pairs], truncate)
        return ScorePlan(pairs, True, inputs, [])
    texts = list(dict.fromkeys(text for pair in pairs for text in pair))
    position = {text: i for i, text in enumerate(texts)}
    inputs = encode_texts(tokenizer, pooler, texts, truncate=truncate)
    return ScorePlan(pairs, False, inputs, [(position[a], position[b]) for a, b in pairs], pooler.similarity)
