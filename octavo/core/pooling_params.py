"""Pooling requests: what one asks for (``PoolingParams``, vLLM's name) and
what the loaded model offers (``PoolerConfig``).

A pooling request is a request whose prompt is computed once, in one step,
and which finishes with one pooled vector instead of sampled tokens: an
embedding (task ``embed``) or a classifier's scores (task ``classify``).
Scoring and reranking are built on these two by the front ends (a
cross-encoder classifies a text pair; a bi-encoder compares two embeddings).

Invariants: both classes hold plain values only (they cross process
boundaries as msgpack); ``PoolingParams`` checks what it can on its own in
``__post_init__`` and the engine checks it against the model's
``PoolerConfig`` before anything is scheduled (``check_pooling_params``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from octavo.errors import InvalidArgumentError, UnsupportedTaskError

POOLING_TASKS = ("embed", "classify")
# What a classifier's scores go through before they are returned.
ACTIVATIONS = ("softmax", "sigmoid", "none")


@dataclass
class PoolingParams:
    task: str = "embed"
    # Matryoshka: keep the first ``dimensions`` values (then normalise).
    dimensions: int | None = None
    # Embeddings: None follows the model (a sentence-transformers Normalize
    # module, or the architecture's default).
    normalize: bool | None = None
    # Classification: None follows the model (softmax, sigmoid or none);
    # False returns the raw logits.
    use_activation: bool | None = None

    def __post_init__(self) -> None:
        if self.task not in POOLING_TASKS:
            raise InvalidArgumentError(f"task must be one of {', '.join(POOLING_TASKS)}, got {self.task!r}", param="task")
        if self.dimensions is not None:
            if isinstance(self.dimensions, bool) or not isinstance(self.dimensions, int) or self.dimensions < 1:
                raise InvalidArgumentError(f"dimensions must be a positive integer, got {self.dimensions!r}", param="dimensions")
            if self.task != "embed":
                raise InvalidArgumentError("dimensions applies to embeddings only", param="dimensions")
        for name in ("normalize", "use_activation"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise InvalidArgumentError(f"{name} must be true, false or null, got {value!r}", param=name)
        if self.normalize is not None and self.task != "embed":
            raise InvalidArgumentError("normalize applies to embeddings only", param="normalize")
        if self.use_activation is not None and self.task != "classify":
            raise InvalidArgumentError("use_activation applies to classification only", param="use_activation")

    @property
    def n(self) -> int:
        """A pooling request is one sequence (what admission caps count)."""
        return 1

    def clone(self) -> PoolingParams:
        return copy.deepcopy(self)


@dataclass
class PoolerConfig:
    """How the loaded model pools, as its checkpoint says (see
    ``octavo.models.pooling_config``); the front ends read it from
    ``EngineLimits.pooler``."""

    task: str
    # Length of the pooled vector: the embedding size, or the number of labels.
    output_size: int
    # Embeddings: sentence-transformers pooling modes, concatenated in order.
    pooling_modes: list[str] = field(default_factory=list)
    # Embeddings: whether the model normalises its output (L2).
    normalize: bool = False
    # Classification: what the logits go through (one of ACTIVATIONS).
    activation: str = "none"
    # Classification: label names by index.
    labels: list[str] = field(default_factory=list)
    # The embedding sizes a Matryoshka model was trained for, if it lists them.
    matryoshka_dimensions: list[int] | None = None
    # token_type_ids below this are accepted (BERT's segments); 0: none are.
    num_token_types: int = 0
    # sentence-transformers' do_lower_case: texts are lowercased before tokenizing.
    lowercase: bool = False
    # The longest input the model takes (positions, or sentence-transformers' max_seq_length).
    max_model_len: int | None = None
    # True for encoder-only models: no KV cache, every prompt in one step.
    is_encoder: bool = False
    # How an embedding model scores a text pair (sentence-transformers'
    # similarity_fn_name): cosine, dot, euclidean or manhattan (negated distances).
    similarity: str = "cosine"


def check_pooling_params(params: PoolingParams, pooler: PoolerConfig | None) -> None:
    """Raise the typed error for a request the loaded model cannot serve."""
    if pooler is None:
        raise UnsupportedTaskError(
            f"this model generates text; it does not serve {params.task!r} requests "
            "(start the server on an embedding or classification model, or pass --task)",
            param="model",
        )
    if params.task != pooler.task:
        raise UnsupportedTaskError(
            f"this model serves {pooler.task!r} requests, not {params.task!r}", param="model"
        )
    if params.dimensions is not None:
        allowed = pooler.matryoshka_dimensions
        if allowed and params.dimensions not in allowed:
            raise InvalidArgumentError(
                f"dimensions={params.dimensions} is not one the model was trained for ({allowed})", param="dimensions"
            )
        if params.dimensions > pooler.output_size:
            raise InvalidArgumentError(
                f"dimensions={params.dimensions} exceeds the embedding size ({pooler.output_size})", param="dimensions"
            )
