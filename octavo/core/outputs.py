"""What the engine returns, with vLLM's names (``RequestOutput``,
``CompletionOutput``, ``Logprob``; ``PoolingRequestOutput`` for pooling
requests)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# One dict per position: token id -> Logprob (the chosen token and the top-k).
SampleLogprobs = list[dict[int, Logprob]]
# Prompt logprobs: position 0 has no distribution, hence ``None``.
PromptLogprobs = list[dict[int, Logprob] | None]


@dataclass(slots=True)
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_generation_tokens: int = 0
    # Which of the request's n sequences these timings are (the choice index):
    # a stable key even after the object crossed a process boundary.
    sequence_index: int = 0


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: SampleLogprobs | None = None
    finish_reason: str | None = None
    # The stop string or stop token id that ended the output, if any.
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    prompt_logprobs: PromptLogprobs | None = None
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = field(default=None, repr=False)

    @property
    def failed(self) -> bool:
        """The engine ended the request with an error (``finish_reason="error"``)."""
        return any(c.finish_reason == "error" for c in self.outputs)


@dataclass
class PoolingOutput:
    """One pooled vector: an embedding, or a classifier's scores.

    Kept as its float32 little-endian bytes (``raw``: what crosses processes,
    and what base64 encodings send as they are); ``data`` views them as a
    numpy array without a copy, ``embedding`` / ``probs`` are Python lists."""

    raw: bytes

    @classmethod
    def from_values(cls, values) -> PoolingOutput:
        return cls(np.ascontiguousarray(values, dtype="<f4").tobytes())

    @property
    def data(self) -> np.ndarray:
        return np.frombuffer(self.raw, dtype="<f4")

    @property
    def embedding(self) -> list[float]:
        return self.data.tolist()

    @property
    def probs(self) -> list[float]:
        return self.data.tolist()

    @property
    def score(self) -> float:
        """A cross-encoder's (one-label classifier's) score, or a similarity."""
        return float(self.data[0])


@dataclass(slots=True)
class PoolingRequestOutput:
    """What a pooling request returns (vLLM's name); always final.

    ``finish_reason`` is "stop", or "error" when the engine could not compute
    it (``outputs`` is then None)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: PoolingOutput | None
    finished: bool = True
    finish_reason: str = "stop"
    metrics: RequestMetrics | None = field(default=None, repr=False)

    @property
    def failed(self) -> bool:
        return self.finish_reason == "error"
