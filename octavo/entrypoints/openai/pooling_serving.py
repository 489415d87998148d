"""What the pooling routes (embeddings, score, rerank, classify) share: input
parsing and tokenising (on the tokenizer pool, size limits first),
validation of every input before any is admitted, admission of many inputs
at once, and collecting their vectors.

Invariants (as ``serving.py``'s for generation): a bad request schedules
nothing, and the cheap checks run before tokenising; every admitted stream is
closed (aborted unless finished) on every path out; a client that disconnects
aborts its inputs. One request carries at most ``max_pooling_inputs(ctx)``
inputs (a 400 past that), so an idle server never answers it "busy".
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request

from octavo.core.outputs import PoolingRequestOutput
from octavo.core.pooling_batch import PoolingBatch
from octavo.core.pooling_params import PoolingParams
from octavo.entrypoints.async_engine import RequestStream
from octavo.entrypoints.openai.prompts import check_chars
from octavo.entrypoints.openai.serving import ServingContext, final_outputs, unless_disconnected
from octavo.entrypoints.pooling_inputs import PoolingInput, encode_texts, plan_scores, token_inputs, truncation_length
from octavo.errors import EngineDeadError, InvalidArgumentError, QueueFullError

# OpenAI's cap on inputs per embeddings request.
MAX_INPUTS_PER_REQUEST = 2048


def max_pooling_inputs(ctx: ServingContext) -> int:
    cap = ctx.engine.config.max_inflight_seqs
    return MAX_INPUTS_PER_REQUEST if cap is None else min(MAX_INPUTS_PER_REQUEST, cap)


def check_num_inputs(ctx: ServingContext, num_inputs: int, param: str = "input") -> None:
    if num_inputs == 0:
        raise InvalidArgumentError(f"{param} is empty", param=param)
    limit = max_pooling_inputs(ctx)
    if num_inputs > limit:
        raise InvalidArgumentError(
            f"this request has {num_inputs} inputs; the server takes at most {limit} in one request", param=param
        )


def truncation(ctx: ServingContext, truncate_prompt_tokens: int | None) -> int | None:
    return truncation_length(truncate_prompt_tokens, ctx.limits.max_model_len)


def check_text_sizes(ctx: ServingContext, texts: list[str], truncate: int | None, param: str) -> None:
    """A text that could never fit is refused before tokenising, unless truncation
    was asked for (then it is tokenised, on the pool, and cut)."""
    if truncate is None:
        for text in texts:
            check_chars(len(text), ctx.prompt_limits, param)


async def parse_inputs(ctx: ServingContext, value: Any, truncate_prompt_tokens: int | None) -> list[PoolingInput]:
    """``input`` (a text, texts, token ids, or lists of token ids) -> inputs."""
    truncate = truncation(ctx, truncate_prompt_tokens)
    items = [value] if isinstance(value, str) or (value and isinstance(value[0], int)) else list(value)
    check_num_inputs(ctx, len(items))
    if isinstance(items[0], str):
        check_text_sizes(ctx, items, truncate, "input")
        return await ctx.pool.run(encode_texts, ctx.limits.pooler, items, None, truncate)
    return token_inputs(items, truncate, ctx.tokenizer)


async def plan_pair_scores(ctx: ServingContext, pairs: list[tuple[str, str]], truncate_prompt_tokens, param: str):
    """``plan_scores`` on the pool, after the size checks."""
    truncate = truncation(ctx, truncate_prompt_tokens)
    check_num_inputs(ctx, len(pairs), param)
    check_text_sizes(ctx, list(dict.fromkeys(text for pair in pairs for text in pair)), truncate, param)
    plan = await ctx.pool.run(plan_scores, ctx.limits.pooler, pairs, truncate)
    check_num_inputs(ctx, len(plan.inputs), param)  # a bi-encoder runs up to two inputs a pair
    return plan


async def run_pooling(
    request: Request, ctx: ServingContext, request_id: str, inputs: list[PoolingInput], params: PoolingParams
) -> list[PoolingRequestOutput]:
    """Validate every input, admit them all (or none), return their outputs in order."""
    validator = ctx.engine.engine
    for item in inputs:
        validator.validate(item.token_ids, params)
        validator.validate_token_type_ids(item.token_ids, item.token_type_ids)
    streams = await _admit(ctx, request_id, inputs, params)
    try:
        finals = await unless_disconnected(request, final_outputs(ctx, streams))
    finally:
        for stream in streams:
            ctx.engine.close(stream)
    for output in finals:
        if not isinstance(output, PoolingRequestOutput) or output.outputs is None:
            raise EngineDeadError("the engine could not compute this request; retry it")
    return finals


async def _admit(
    ctx: ServingContext, request_id: str, inputs: list[PoolingInput], params: PoolingParams
) -> list[RequestStream]:
    """All inputs handed to the engine thread at once: one batch command where
    the engine takes batches (checked together, all queued or none), else one
    command each in one batch; if any is refused, the others are aborted."""
    ids = [request_id if len(inputs) == 1 else f"{request_id}-{i}" for i in range(len(inputs))]
    if ctx.engine.takes_pooling_batches:
        batch = PoolingBatch(ids, [item.text for item in inputs], [item.token_ids for item in inputs],
                             [item.token_type_ids for item in inputs])
        try:
            return await ctx.engine.add_pooling_batch(batch, params)
        except QueueFullError:
            ctx.metrics.requests_rejected.labels(reason="queue_full").inc()
            raise
    results = await asyncio.gather(
        *(ctx.engine.add_request(engine_id, item.as_engine_prompt(), params) for engine_id, item in zip(ids, inputs)),
        return_exceptions=True,
    )
    errors = [r for r in results if isinstance(r, BaseException)]
    if not errors:
        return list(results)
    for result in results:
        if isinstance(result, RequestStream):
            ctx.engine.close(result)
    if any(isinstance(e, QueueFullError) for e in errors):
        ctx.metrics.requests_rejected.labels(reason="queue_full").inc()
    raise errors[0]


def usage(inputs: list[PoolingInput]) -> dict:
    num_tokens = sum(len(item.token_ids) for item in inputs)
    return {"prompt_tokens": num_tokens, "total_tokens": num_tokens, "completion_tokens": 0}
