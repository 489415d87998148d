"""Compact rows for the outputs an engine process streams to its front.

A replica sends, after each step, one output per request that made
progress; at 256 streams that is 256 outputs a step, so their encoding is on
the engine loop's critical path. The generic codec (``serialization``)
would send each as nested dataclass extensions, and every ``RequestOutput``
carries its whole prompt (text and token ids) again: ~4.5 KB per streamed
token at 590-token prompts, more than a pipe buffer per step, so the engine
waited on the API process to read.

Here a ``RequestOutput`` travels as a flat row of plain values without its
prompt, which the front already has (it sent it); the front re-attaches it.
Anything else (a pooling output, ...) travels as itself through the generic
codec, so the stream may mix both.

Row: ``[request_id, finished, num_cached_tokens, metrics, completions,
prompt_logprobs]`` where ``metrics`` is ``RequestMetrics``' fields in order
(or None), each completion is ``[index, text, token_ids,
cumulative_logprob, logprobs, finish_reason, stop_reason]``, and logprobs
are lists of ``[token_id, logprob, rank, decoded_token]`` per position
(``None`` for a prompt position without a distribution).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from octavo.core.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput

_METRICS_FIELDS = tuple(f.name for f in dataclasses.fields(RequestMetrics))

# The front's record of a request's prompt: (text or None, token ids).
PromptLookup = Callable[[str], tuple[str | None, list[int]]]


def pack_outputs(outputs: list) -> list:
    """Rows for the ``RequestOutput``s; other outputs stay as they are."""
    return [_pack_output(o) if type(o) is RequestOutput else o for o in outputs]


def unpack_outputs(rows: list, prompt_of: PromptLookup) -> list:
    """The outputs back, each ``RequestOutput`` with its prompt from ``prompt_of``."""
    return [_unpack_output(row, prompt_of) if type(row) is list else row for row in rows]


def output_request_id(item) -> str:
    """The request id of a packed row or of an output sent as itself."""
    return item[0] if type(item) is list else item.request_id


def _pack_output(output: RequestOutput) -> list:
    metrics = output.metrics
    return [
        output.request_id,
        output.finished,
        output.num_cached_tokens,
        None if metrics is None else [getattr(metrics, name) for name in _METRICS_FIELDS],
        [_pack_completion(c) for c in output.outputs],
        None if output.prompt_logprobs is None else [_pack_position(p) for p in output.prompt_logprobs],
    ]


def _pack_completion(completion: CompletionOutput) -> list:
    logprobs = completion.logprobs
    return [
        completion.index,
        completion.text,
        completion.token_ids,
        completion.cumulative_logprob,
        None if logprobs is None else [_pack_position(p) for p in logprobs],
        completion.finish_reason,
        completion.stop_reason,
    ]


def _pack_position(position: dict[int, Logprob] | None) -> list | None:
    if position is None:
        return None
    return [[token_id, lp.logprob, lp.rank, lp.decoded_token] for token_id, lp in position.items()]


def _unpack_position(rows: list | None) -> dict[int, Logprob] | None:
    if rows is None:
        return None
    return {token_id: Logprob(logprob, rank, decoded) for token_id, logprob, rank, decoded in rows}


def _unpack_output(row: list, prompt_of: PromptLookup) -> RequestOutput:
    request_id, finished, num_cached_tokens, metrics, completions, prompt_logprobs = row
    prompt, prompt_token_ids = prompt_of(request_id)
    outputs = []
    for index, text, token_ids, cumulative_logprob, logprobs, finish_reason, stop_reason in completions:
        if logprobs is not None:
            logprobs = [_unpack_position(p) for p in logprobs]
        outputs.append(CompletionOutput(index, text, token_ids, cumulative_logprob, logprobs, finish_reason, stop_reason))
    return RequestOutput(
        request_id=request_id,
        prompt=prompt,
        prompt_token_ids=prompt_token_ids,
        outputs=outputs,
        finished=finished,
        prompt_logprobs=None if prompt_logprobs is None else [_unpack_position(p) for p in prompt_logprobs],
        num_cached_tokens=num_cached_tokens,
        metrics=None if metrics is None else RequestMetrics(*metrics),
    )
