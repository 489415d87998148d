"""Many pooling inputs queued as one batch (issue 21).

``LLM.embed`` of 256 short sentences queues 256 requests that share one
``PoolingParams``. Through ``add_request`` each would pay for the checks
and bookkeeping any request needs (the prompt's shape, the params, the
priority, a copy of its ids), which on a GPU host costs about as much as
the model's forward. Here what is the same for every input is checked once,
the rest over the whole batch in C (the lengths' and the ids' bounds), and
only when something fails does each input go through ``validate`` in order,
so that the error raised is the one ``add_request`` would have raised for
the first bad input. Nothing is queued unless every input passes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from octavo.core.pooling_params import PoolingParams, check_pooling_params
from octavo.core.request import Request
from octavo.core.sampling_params import SamplingParams
from octavo.errors import InvalidArgumentError

if TYPE_CHECKING:
    from octavo.core.engine import RequestValidator

# Pooling requests carry no sampling; the scheduler and runner still read a
# SamplingParams (no prompt logprobs, nothing to detokenize).
POOLING_SAMPLING_PARAMS = SamplingParams(max_tokens=None, detokenize=False)


@dataclass
class PoolingBatch:
    """Inputs to pool, one per request id. The lists are taken, not copied:
    the caller hands them over (``LLM`` builds them for the call)."""

    request_ids: list[str]
    texts: list[str | None]  # the prompt each output reports (None for token ids)
    token_ids: list[list[int]]
    token_type_ids: list[list[int] | None]  # None: all zero
    # Every input was tokenized by the engine's own tokenizer: its ids are in
    # the model's range whenever the tokenizer's largest id is (``TokenizerIdBound``).
    from_tokenizer: bool = False


class TokenizerIdBound:
    """The largest id a tokenizer can give, looked up once per tokenizer and
    vocabulary size (adding tokens grows both)."""

    def __init__(self) -> None:
        self._key: tuple[Any, int] | None = None
        self._largest = -1

    def largest(self, tokenizer: Any) -> int:
        size = len(tokenizer)
        if self._key is None or self._key[0] is not tokenizer or self._key[1] != size:
            self._largest = max(tokenizer.get_vocab().values(), default=-1)
            self._key = (tokenizer, size)
        return self._largest


def check_pooling_batch(
    validator: RequestValidator, batch: PoolingBatch, params: PoolingParams, ids_in_use: dict
) -> None:
    """Raise what ``add_request`` would raise for the batch's first bad input (or id)."""
    limits = validator.limits
    check_pooling_params(params, limits.pooler)
    lists = batch.token_ids
    if not lists:
        return
    # map() over builtins: the bounds of 256 lists in C instead of a Python loop.
    fine = min(map(len, lists)) > 0 and max(map(len, lists)) <= limits.max_model_len
    bound = getattr(validator, "tokenizer_id_bound", None)
    if not (batch.from_tokenizer and bound is not None and bound.largest(validator.tokenizer) < limits.vocab_size):
        fine = fine and 0 <= min(map(min, lists)) and max(map(max, lists)) < limits.vocab_size
    if not fine or any(types is not None for types in batch.token_type_ids):
        for token_ids, types in zip(lists, batch.token_type_ids):
            validator.validate(token_ids, params)
            validator.validate_token_type_ids(token_ids, types)
    request_ids = batch.request_ids
    if len(set(request_ids)) != len(request_ids) or not ids_in_use.keys().isdisjoint(request_ids):
        seen = set(ids_in_use)
        for request_id in request_ids:
            if request_id in seen:
                raise InvalidArgumentError(f"request id {request_id!r} is already in use", param="request_id")
            seen.add(request_id)


def pooling_requests(batch: PoolingBatch, params: PoolingParams, block_size: int) -> list[Request]:
    """The scheduler's requests for a checked batch (sharing its id lists), arrived together."""
    now = time.monotonic()
    return [
        Request(
            request_id=request_id,  # a RequestId is the str itself
            prompt_token_ids=token_ids,
            sampling_params=POOLING_SAMPLING_PARAMS,
            max_tokens=0,
            block_size=block_size,
            arrival_time=now,
            pooling_params=params,
            token_type_ids=types,
        )
        for request_id, token_ids, types in zip(batch.request_ids, batch.token_ids, batch.token_type_ids)
    ]
