"""Compact rows for the per-step progress an engine process streams to its front.

An engine process sends, after each step, one ``EngineCoreOutput`` per
child request that made progress (``core/engine_core.py``): at 256 streams,
256 a step, on the engine loop's critical path. The generic codec
(``serialization``) would send each as nested dataclass extensions; here
each is a flat row of plain values, and logprobs are lists. Anything else
(a pooling output, ...) travels as itself through the generic codec, so
the stream may mix both.

Row: ``[request_id, new_token_ids, new_logprobs, new_prompt_logprobs,
finish_reason, stop_reason, num_cached_tokens, first_scheduled_time, pooled]``, where each logprobs
entry is ``[token_ids, logprobs, ranks]`` and an empty list stays empty; ``pooled`` is a
finished pooling request's vector (bytes) or None.
"""

from __future__ import annotations

from octavo.core.scheduler_output import EngineCoreOutput, TokenLogprobs


def pack_outputs(outputs: list) -> list:
    """Rows for the ``EngineCoreOutput``s; other outputs stay as they are."""
    return [_pack(o) if type(o) is EngineCoreOutput else o for o in outputs]


def unpack_outputs(rows: list) -> list:
    return [_unpack(row) if type(row) is list else row for row in rows]


def output_request_id(item) -> str:
    """The request id of a packed row or of an output sent as itself."""
    return item[0] if type(item) is list else item.request_id


def _pack(output: EngineCoreOutput) -> list:
    # Most outputs carry no logprobs: the tests skip building empty lists (per request, per step).
    logprobs, prompt_logprobs = output.new_logprobs, output.new_prompt_logprobs
    return [
        output.request_id,
        output.new_token_ids,
        [[e.token_ids, e.logprobs, e.ranks] for e in logprobs] if logprobs else [],
        [[e.token_ids, e.logprobs, e.ranks] for e in prompt_logprobs] if prompt_logprobs else [],
        output.finish_reason,
        output.stop_reason,
        output.num_cached_tokens,
        output.first_scheduled_time,
        output.pooled,
    ]


def _unpack(row: list) -> EngineCoreOutput:
    request_id, token_ids, logprobs, prompt_logprobs, finish_reason, stop_reason, num_cached_tokens, scheduled, pooled = row
    return EngineCoreOutput(
        request_id,
        token_ids,
        [TokenLogprobs(*entry) for entry in logprobs] if logprobs else [],
        [TokenLogprobs(*entry) for entry in prompt_logprobs] if prompt_logprobs else [],
        finish_reason,
        stop_reason,
        num_cached_tokens,
        pooled,
        scheduled,
    )
