"""``POST /v1/completions``: one or many prompts (text or token ids), n choices each.

Choice ``index`` is ``prompt_position * n + choice``, as OpenAI numbers them.
Streams send one chunk per new piece of text (with its logprobs), a final
chunk per choice carrying ``finish_reason``, an optional usage chunk
(``stream_options.include_usage``), then ``[DONE]``; an engine failure mid-stream
sends an error chunk and then ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from octavo.core.outputs import CompletionOutput, RequestOutput
from octavo.core.sampling_params import RequestOutputKind
from octavo.entrypoints.async_engine import RequestStream
from octavo.entrypoints.failures import record_failure
from octavo.entrypoints.openai.beam_serving import beam_search_all, beam_search_params, length_check_params
from octavo.entrypoints.openai.errors import ApiError, from_octavo, openai_body
from octavo.entrypoints.openai.field_policy import check_undeclared_fields
from octavo.entrypoints.openai.logprobs import LegacyLogprobs, prompt_logprobs_json
from octavo.entrypoints.openai.openapi import add_json_route
from octavo.entrypoints.openai.prompts import PromptInput
from octavo.entrypoints.openai.protocol import CompletionRequest
from octavo.entrypoints.openai.responses import CompletionResponse
from octavo.entrypoints.openai.serving import (
    SSE_DONE,
    tokens_as_ids,
    ServingContext,
    SSEResponse,
    admit_all,
    check_admissible,
    check_request_options,
    with_adapter,
    check_prompt,
    encode_prompt,
    final_outputs,
    get_context,
    make_sampling_params,
    merge_outputs,
    new_request_id,
    parse_body,
    resolve_model,
    sse,
    unix_time,
    unless_disconnected,
)
from octavo.entrypoints.openai.structured import check_constraint, constraint_from_request
from octavo.errors import InvalidArgumentError, OctavoError


async def create_completion(request: Request):
    ctx = get_context(request)
    body = await parse_body(request, CompletionRequest)
    model = resolve_model(ctx, body.model)
    _reject_unsupported(body)
    if body.use_beam_search:
        return await _beam_search_completion(request, ctx, model, body)
    constraint, constraint_param = constraint_from_request(body)
    echo_prompt_logprobs = body.logprobs if body.echo and body.logprobs is not None else None
    # Asked for (vLLM's prompt_logprobs) and echoed (echo with logprobs): the engine computes the larger.
    prompt_logprobs = max((n for n in (body.prompt_logprobs, echo_prompt_logprobs) if n is not None), default=None)
    # echo with max_tokens=0 scores the prompt: one token is generated and dropped (as vLLM does).
    echo_only = bool(body.echo) and body.max_tokens == 0
    sent_max_tokens = "max_tokens" in body.model_fields_set and body.max_tokens is not None and not echo_only
    params = make_sampling_params(
        ctx,
        1 if echo_only else body.max_tokens,
        **body.sampling_options(),
        logprobs=body.logprobs,
        prompt_logprobs=prompt_logprobs,
        output_kind=RequestOutputKind.DELTA if body.stream else RequestOutputKind.FINAL_ONLY,
        structured_outputs=constraint,
    )
    check_admissible(ctx, params, _num_prompts(body.prompt))
    options = body.request_options()
    check_request_options(ctx, options)
    # A prompt that truncate_prompt_tokens will cut may be longer than the context.
    prompts = await prompt_inputs(ctx, body.prompt, fit_context=params.truncate_prompt_tokens is None)
    prompts = [check_prompt(ctx, prompt, params, "prompt", "max_tokens" if sent_max_tokens else None)
               for prompt in prompts]
    await check_constraint(ctx.engine.engine, params, constraint_param)
    request_id = new_request_id("cmpl")
    streams = await admit_all(ctx, request_id, prompts, params, options, model)
    builder = CompletionBuilder(ctx, request_id, model, body, prompts, echo_only)
    if body.stream:
        return SSEResponse(_stream(ctx, streams, builder), on_close=lambda: _close(ctx, streams))
    try:
        finals = await unless_disconnected(request, final_outputs(ctx, streams))
    finally:
        _close(ctx, streams)
    return JSONResponse(builder.response(finals))


async def _beam_search_completion(request: Request, ctx: ServingContext, model: str, body: CompletionRequest):
    params = beam_search_params(body, body.max_tokens, ctx.limits.max_logprobs)
    options = with_adapter(ctx, body.request_options(), model)
    check_request_options(ctx, options)
    prompts = await prompt_inputs(ctx, body.prompt)
    sent_max_tokens = "max_tokens" in body.model_fields_set
    prompts = [check_prompt(ctx, prompt, length_check_params(params), "prompt", "max_tokens" if sent_max_tokens else None)
               for prompt in prompts]
    request_id = new_request_id("cmpl")
    finals = await unless_disconnected(request, beam_search_all(ctx, request_id, prompts, params, options))
    return JSONResponse(CompletionBuilder(ctx, request_id, model, body, prompts).response(finals))


def _close(ctx: ServingContext, streams: list[RequestStream]) -> None:
    for stream in streams:
        ctx.engine.close(stream)


def _reject_unsupported(body: CompletionRequest) -> None:
    check_undeclared_fields(body, "completions")
    body.check_prompt_logprobs()
    if body.suffix:
        raise InvalidArgumentError("suffix is not supported", param="suffix")
    if body.best_of is not None and body.best_of != (body.n or 1):
        raise InvalidArgumentError("best_of is not supported (it must equal n)", param="best_of")


def _num_prompts(prompt) -> int:
    if isinstance(prompt, str) or not prompt or not isinstance(prompt[0], (str, list)):
        return 1
    return len(prompt)


async def prompt_inputs(ctx: ServingContext, prompt, fit_context: bool = True) -> list[PromptInput]:
    """The request's prompts, text ones tokenised on the pool (a batch of texts concurrently)."""
    if isinstance(prompt, str):
        return [await encode_prompt(ctx, prompt, fit_context=fit_context)]
    if not prompt:
        raise InvalidArgumentError("the prompt is empty", param="prompt")
    if isinstance(prompt[0], str):
        return list(await asyncio.gather(*(encode_prompt(ctx, item, fit_context=fit_context) for item in prompt)))
    if isinstance(prompt[0], int):
        return [PromptInput(None, list(prompt))]
    return [PromptInput(None, list(item)) for item in prompt]


class CompletionBuilder:
    """Turns engine outputs into OpenAI completion objects and stream chunks."""

    def __init__(
        self, ctx: ServingContext, request_id: str, model: str, body: CompletionRequest, prompts, echo_only: bool = False
    ) -> None:
        self.ctx = ctx
        self.request_id = request_id
        self.model = model
        self.body = body
        self.prompts: list[PromptInput] = prompts
        # Prompt scoring (echo, max_tokens=0): the one generated token is not part of the answer.
        self.echo_only = echo_only
        self.n = body.n or 1
        self.created = unix_time()
        self.num_completion_tokens = 0
        self.num_cached_tokens: dict[int, int] = {}  # per prompt: its tokens read from the prefix cache
        self._logprobs: dict[int, LegacyLogprobs] = {}

    def _prompt_text(self, position: int) -> str:
        prompt = self.prompts[position]
        if prompt.text is not None:
            return prompt.text
        return self.ctx.tokenizer.decode(prompt.token_ids) if self.ctx.tokenizer is not None else ""

    def _choice(self, position: int, output: RequestOutput, completion: CompletionOutput, first: bool) -> dict:
        index = position * self.n + completion.index
        if self.echo_only:
            completion = dataclasses.replace(completion, text="", token_ids=[], logprobs=[])
        text = completion.text
        logprobs = None
        if self.body.logprobs is not None:
            accumulator = self._logprobs.get(index)
            if accumulator is None:
                accumulator = self._logprobs[index] = LegacyLogprobs(
                    self.ctx.tokenizer, self.body.logprobs, tokens_as_ids(self.ctx, self.body))
            if first and self.body.echo:
                prompt_ids = self.prompts[position].token_ids
                accumulator.extend(prompt_ids, output.prompt_logprobs or [None] * len(prompt_ids))
            accumulator.extend(completion.token_ids, completion.logprobs or [])
            logprobs = accumulator.take()
        if first and self.body.echo:
            text = self._prompt_text(position) + text
        self.num_completion_tokens += len(completion.token_ids)
        choice = {
            "index": index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": completion.finish_reason,
            "stop_reason": completion.stop_reason,
        }
        if self.body.prompt_logprobs is not None:
            choice["prompt_logprobs"] = prompt_logprobs_json(
                self.ctx.tokenizer, self.prompts[position].token_ids, output.prompt_logprobs, self.body.prompt_logprobs,
                tokens_as_ids(self.ctx, self.body))
        if self.body.return_token_ids:  # a stream's choices: the prompt's ids in their first chunk
            if first:
                choice["prompt_token_ids"] = list(self.prompts[position].token_ids)
            choice["token_ids"] = list(completion.token_ids)
        return choice

    def _envelope(self, choices: list[dict]) -> dict:
        return {
            "id": self.request_id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "system_fingerprint": None,
        }

    def usage(self) -> dict:
        num_prompt_tokens = sum(len(p.token_ids) for p in self.prompts)
        return {
            "prompt_tokens": num_prompt_tokens,
            "completion_tokens": self.num_completion_tokens,
            "total_tokens": num_prompt_tokens + self.num_completion_tokens,
            "prompt_tokens_details": {"cached_tokens": sum(self.num_cached_tokens.values())},
        }

    def response(self, finals: list[RequestOutput]) -> dict:
        choices = []
        for position, output in enumerate(finals):
            self.num_cached_tokens[position] = output.num_cached_tokens
            for completion in output.outputs:
                choices.append(self._choice(position, output, completion, first=True))
        choices.sort(key=lambda choice: choice["index"])
        return {**self._envelope(choices), "usage": self.usage()}

    def chunk(self, position: int, output: RequestOutput, started: set[int]) -> dict | None:
        self.num_cached_tokens[position] = output.num_cached_tokens
        choices = []
        for completion in output.outputs:
            index = position * self.n + completion.index
            if not (completion.token_ids or completion.text or completion.finish_reason):
                continue  # e.g. prompt logprobs of a prompt chunk, or text held back for a stop string
            choices.append(self._choice(position, output, completion, first=index not in started))
            started.add(index)
        return self._envelope(choices) if choices else None

    def usage_chunk(self) -> dict:
        return {**self._envelope([]), "usage": self.usage()}


async def _stream(ctx: ServingContext, streams: list[RequestStream], builder: CompletionBuilder) -> AsyncIterator[str]:
    started: set[int] = set()
    try:
        async for position, output in merge_outputs(ctx, streams):
            chunk = builder.chunk(position, output, started)
            if chunk is not None:
                yield sse(chunk)
        if builder.body.include_usage or ctx.config.enable_force_include_usage:
            yield sse(builder.usage_chunk())
    except OctavoError as exc:
        record_failure(ctx.metrics, builder.request_id, exc)
        yield sse(openai_body(from_octavo(exc)))
    except Exception as exc:
        record_failure(ctx.metrics, builder.request_id, exc)
        yield sse(openai_body(ApiError(500, f"internal server error: {type(exc).__name__}", "internal_error")))
    yield SSE_DONE


def add_routes(app: FastAPI) -> None:
    add_json_route(
        app, "/v1/completions", create_completion, body=CompletionRequest, response=CompletionResponse, streams=True
    )
