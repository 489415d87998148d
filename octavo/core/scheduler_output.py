"""The dataclasses that cross the scheduler / executor boundary.

They hold only plain values (str, int, float, bytes, lists, dicts,
``SamplingParams`` and ``ImageFeature``) so that a multiprocess executor can send them as msgpack.
The runner keeps its own per-request state: a request is described in full
once (``NewRequestData``) and by deltas afterwards (``CachedRequestData``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from octavo.core.image_features import ImageFeature
from octavo.core.lora_request import LoRARequest
from octavo.core.pooling_params import PoolingParams
from octavo.core.sampling_params import SamplingParams


@dataclass(slots=True)
class NewRequestData:
    """A request the runner has not seen (or must forget and re-read: resumed)."""

    request_id: str
    prompt_token_ids: list[int]
    # Tokens generated before a preemption; recomputed like prompt tokens.
    output_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    # A pooling request: pooled once its prompt is computed, never sampled.
    pooling_params: PoolingParams | None = None
    token_type_ids: list[int] | None = None
    # The LoRA adapter the request runs with (the runner loads it on first use).
    lora_request: LoRARequest | None = None
    # The prompt's images not yet computed (their pixel values, their spans).
    image_features: list[ImageFeature] | None = None


@dataclass
class CachedRequestData:
    """What changed for the requests the runner already holds: entry ``i`` of
    each list belongs to ``request_ids[i]``.

    Columns rather than one object per request: at hundreds of decoding
    requests a step, an object each is a construction each in the scheduler
    and a nested message each for a multiprocess executor (msgpack packs
    these lists natively)."""

    request_ids: list[str] = field(default_factory=list)
    new_token_ids: list[list[int]] = field(default_factory=list)
    new_block_ids: list[list[int]] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)


@dataclass
class GrammarBitmask:
    """Which tokens each constrained request may sample this step.

    Row ``i`` belongs to ``request_ids[i]`` (with ``row_counts``, a request
    has that many rows in a row); it is ``num_words`` little-endian
    int32 words where bit ``j`` of word ``w`` allows token ``32 * w + j``
    (xgrammar's layout). Bytes, so that it crosses processes as it is.
    """

    request_ids: list[str]
    words: bytes
    num_words: int
    # Speculative decoding: each request's number of rows (one per draft, then
    # the bonus row's), in order; None: one row each.
    row_counts: list[int] | None = None

    def rows_of(self) -> list[tuple[str, int]]:
        """(request id, its row index from 0) for every row, in order."""
        counts = self.row_counts or [1] * len(self.request_ids)
        return [(request_id, i) for request_id, count in zip(self.request_ids, counts) for i in range(count)]


@dataclass
class SchedulerOutput:
    new_requests: list[NewRequestData] = field(default_factory=list)
    cached_requests: CachedRequestData = field(default_factory=CachedRequestData)
    # {request_id: tokens to compute this step}; its order is the batch order.
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    # Requests whose runner state must be dropped (finished, aborted, preempted).
    finished_request_ids: set[str] = field(default_factory=set)
    # Token masks of the requests that sample under a grammar this step.
    grammar_bitmask: GrammarBitmask | None = None
    # Speculative decoding: each drafting request's draft tokens, computed
    # after its next token in this step (``num_scheduled_tokens`` counts them).
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        return not self.num_scheduled_tokens


@dataclass
class TokenLogprobs:
    """Logprobs at one position: the chosen token first, then the top-k.

    ``ranks[i]`` is the 1-based rank of ``token_ids[i]`` in the distribution.
    """

    token_ids: list[int]
    logprobs: list[float]
    ranks: list[int]


@dataclass
class CompilationCounts:
    """Programs a worker's platform compiled (``Platform.compilations``)."""

    total: int = 0  # since the worker started, warm-up included
    after_warmup: int = 0  # of which after warm-up (each one logged as a warning)


@dataclass
class ModelRunnerOutput:
    # Empty list for a request whose prompt is only partly computed.
    sampled_token_ids: dict[str, list[int]] = field(default_factory=dict)
    logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)
    # Logprobs of the prompt positions computed this step (chunked prefill
    # delivers them in pieces); position 0 has none and is never included.
    prompt_logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)
    # Pooling requests computed this step: their vector, float32 little-endian.
    pooled: dict[str, bytes] = field(default_factory=dict)
    # Speculative decoding with a draft model: the draft model's guesses for
    # each request's next step, made after this step's tokens.
    draft_token_ids: dict[str, list[int]] = field(default_factory=dict)
    # The worker's compilation counts after this step; None where its
    # platform compiles nothing.
    compilations: CompilationCounts | None = None


class PoolingResult(NamedTuple):
    """A pooling request that ended with its step (a tuple: hundreds per step)."""

    request_id: str
    pooled: bytes | None  # None: the runner gave no vector (an error)
    num_cached_tokens: int

    @property
    def finish_reason(self) -> str:
        return "stop" if self.pooled is not None else "error"


@dataclass
class EngineCoreOutput:
    """One request's progress in one step, as the scheduler reports it."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[TokenLogprobs] = field(default_factory=list)
    new_prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    # A finished pooling request's vector (float32 little-endian bytes).
    pooled: bytes | None = None
    # Set by an engine process on a request's first output: when it was first
    # scheduled (time.monotonic, which all processes of a host share), for the
    # front's timings; the in-process engine stamps its own.
    first_scheduled_time: float | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
