"""A request as the scheduler sees it.

Invariant: ``num_computed_tokens <= num_tokens + num_output_placeholders``
(placeholders: async scheduling's samples still in flight, else 0); the scheduler closes the gap
step by step (a whole prompt, a chunk of it, or one new token), with no
separate prefill and decode phases. ``block_hashes`` always holds the hash of
every full block of ``all_token_ids``.

A pooling request (``pooling_params`` set) has no output tokens: its prompt
is computed in one step and it finishes with a pooled vector. It never uses
the prefix cache, so its ``block_hashes`` stay empty.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from octavo.core.image_features import ImageFeature, block_extra_keys
from octavo.core.lora_request import LoRARequest
from octavo.core.pooling_params import PoolingParams
from octavo.core.prefix_hash import extend_block_hashes
from octavo.core.sampling_params import SamplingParams
from octavo.core.types import BlockHash, RequestId


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH_CAPPED = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"

    @property
    def is_finished(self) -> bool:
        # A plain string test: hashing enum members runs Python code, and this
        # is asked for every request on every step.
        return self._value_ in _FINISHED_VALUES

    @property
    def finish_reason(self) -> str | None:
        return self._value_ if self._value_ in _FINISHED_VALUES else None


_FINISHED_VALUES = frozenset({"stop", "length", "abort", "error"})


# Identity equality: a request is one object (``list.remove`` and ``in`` on
# the queues compare it; field-by-field equality would compare ~20 fields).
@dataclass(eq=False, slots=True)
class Request:
    request_id: RequestId
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    # Resolved by the engine: the tokens that end the request (EOS ids).
    eos_token_ids: frozenset[int] = frozenset()
    # Resolved by the engine: min(params.max_tokens, max_model_len - prompt).
    max_tokens: int = 16
    block_size: int = 16
    # Extra prefix-cache key material (cache salt, adapter id).
    cache_key: bytes = b""
    arrival_time: float = field(default_factory=time.monotonic)
    # Set for pooling requests (``sampling_params`` is then unused).
    pooling_params: PoolingParams | None = None
    # BERT's segment ids of the prompt (a text pair), if the model has them.
    token_type_ids: list[int] | None = None
    # Under the priority policy, lower values are served first (vLLM's meaning).
    priority: int = 0
    # The LoRA adapter the request runs with (its id is also in ``cache_key``).
    lora_request: LoRARequest | None = None
    # The prompt's images (their placeholder spans, in order; their
    # identifiers key the prefix-cache blocks that hold the spans).
    image_features: tuple[ImageFeature, ...] = ()

    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    # Async scheduling: tokens a batch in flight is sampling, not known yet
    # (``num_computed_tokens`` may run ahead of ``num_tokens`` by this many).
    num_output_placeholders: int = 0
    num_preemptions: int = 0
    # Prompt tokens found in the prefix cache when the request first started.
    num_cached_tokens: int = 0
    # Prompt positions whose logprobs were reported (a request recomputed
    # after preemption computes them again; they are not reported twice).
    num_prompt_logprobs_sent: int = 0
    # Speculative decoding with a draft model: the workers' drafts for the
    # request's next step (from the last step's output).
    spec_token_ids: list[int] = field(default_factory=list)
    # What stopped the request: the stop token id or stop string, if any.
    stop_reason: int | str | None = None
    output_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(default_factory=list)
    block_hashes: list[BlockHash] = field(default_factory=list)
    # A ``RequestGrammar`` when the output is constrained (structured outputs).
    grammar: Any = None

    def __post_init__(self) -> None:
        if self.pooling_params is not None:
            # Never extended (no output tokens): one list less per input of a pooling batch.
            self.all_token_ids = self.prompt_token_ids
            return
        self.all_token_ids = list(self.prompt_token_ids)
        extend_block_hashes(self.block_hashes, self.all_token_ids, self.block_size, self.cache_key, self._image_keys)

    @property
    def _image_keys(self):
        """The images' share of each block's prefix-cache key (None: a text prompt)."""
        features = self.image_features
        if not features:
            return None
        return lambda start, end: block_extra_keys(features, start, end)

    @property
    def is_pooling(self) -> bool:
        return self.pooling_params is not None

    @property
    def lora_int_id(self) -> int:
        return self.lora_request.lora_int_id if self.lora_request is not None else 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def unsent_prompt_logprobs(self, start: int, entries: list) -> list:
        """The prompt logprobs of a step that began at position ``start``, less
        those already reported (a request computed again after a preemption)."""
        num_sent = self.num_prompt_logprobs_sent
        self.num_prompt_logprobs_sent = max(num_sent, start + len(entries))
        return entries[max(0, num_sent - start) :]

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        all_token_ids = self.all_token_ids
        all_token_ids.append(token_id)
        # Most tokens fill no block: no hashing call for them (every step, every request).
        if len(all_token_ids) // self.block_size > len(self.block_hashes):
            extend_block_hashes(self.block_hashes, all_token_ids, self.block_size, self.cache_key, self._image_keys)
