"""What every generation route shares: the serving context, body parsing,
validation before admission, admission of a batch of prompts, SSE framing and
client-disconnect handling.

Invariants: every check a request can fail (schema, model name, sampling
values, size caps, prompt length plus ``max_tokens``, a request larger than
the server ever admits) runs before any of its prompts is admitted, so a bad
request schedules nothing; the cheap checks run before tokenising; and every
admitted stream is closed (aborted unless finished) on every path out of a
route. Tokenising and chat templates run on the tokenizer pool, never on
the event loop; parsing the JSON body does run on it (pydantic's parser
holds the interpreter lock, so a thread would not help), bounded by the
body-size limit.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.responses import StreamingResponse

from octavo.core.engine import EngineLimits, check_priority
from octavo.core.lora_request import LoRARequest
from octavo.core.outputs import RequestOutput
from octavo.core.sampling_params import SamplingParams
from octavo.entrypoints import fast_json
from octavo.entrypoints.async_engine import AsyncEngine, RequestStream
from octavo.entrypoints.engine_commands import RequestOptions
from octavo.entrypoints.engine_stats import engine_capacity
from octavo.entrypoints.logging_setup import current_request_id
from octavo.entrypoints.metrics import ServerMetrics
from octavo.entrypoints.openai.config import ServerConfig
from octavo.entrypoints.openai.errors import InvalidRequestBodyError
from octavo.entrypoints.openai.prompts import PromptInput, PromptLimits, encode_text, prompt_too_long
from octavo.entrypoints.openai.tokenizer_pool import TokenizerPool
from octavo.errors import (
    InvalidArgumentError,
    ModelNotFoundError,
    PromptTooLongError,
    QueueFullError,
    RequestAbortedError,
)
from octavo.models.generation_defaults import engine_sampling_defaults, with_sampling_defaults

logger = logging.getLogger(__name__)
ModelT = TypeVar("ModelT", bound=BaseModel)
SSE_DONE = "data: [DONE]\n\n"


@dataclass
class ServingContext:
    engine: AsyncEngine
    config: ServerConfig
    # The event loop's own tokenizer (small decodes: logprob tokens, echoed
    # token-id prompts); the pool's workers and the engine thread have theirs.
    tokenizer: Any
    limits: EngineLimits
    metrics: ServerMetrics
    pool: TokenizerPool
    prompt_limits: PromptLimits
    draining: bool = False
    # The LoRA adapters served by name (--lora-modules, checked by the engine at
    # start-up, and those loaded at run time), and the id the next load takes.
    lora_requests: dict[str, LoRARequest] = field(default_factory=dict)
    next_lora_id: int = 1


def get_context(request: Request) -> ServingContext:
    return request.app.state.octavo


def tokens_as_ids(ctx: ServingContext, body) -> bool:
    """Whether logprob tokens are written ``token_id:N``: the request's
    ``return_tokens_as_token_ids``, else the server's (``--return-tokens-as-token-ids``)."""
    value = body.return_tokens_as_token_ids
    return ctx.config.return_tokens_as_token_ids if value is None else bool(value)


async def parse_body(request: Request, model: type[ModelT]) -> ModelT:
    body = await request.body()
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise _body_error(exc) from None


def _body_error(exc: ValidationError) -> InvalidRequestBodyError:
    first = exc.errors(include_url=False)[0]
    if first["type"] == "json_invalid":
        return InvalidRequestBodyError(f"the request body is not valid JSON: {first['msg']}")
    param = ".".join(str(part) for part in first["loc"]) or None
    message = f"{param}: {first['msg']}" if param else f"the request body: {first['msg']}"
    return InvalidRequestBodyError(message, param=param)


def resolve_model(ctx: ServingContext, requested: str | None) -> str:
    """The served name a request asks for: the base model's or an adapter's (--lora-modules)."""
    if requested is None:
        return ctx.config.model_name
    if requested not in ctx.config.served_model_names and requested not in ctx.lora_requests:
        raise ModelNotFoundError(f"the model `{requested}` does not exist", param="model")
    return requested


async def encode_prompt(ctx: ServingContext, text: str, add_special_tokens: bool = True, fit_context: bool = True):
    """Tokenise one prompt text on the pool (size limits first)."""
    return await ctx.pool.run(encode_text, text, add_special_tokens, ctx.prompt_limits, "prompt", fit_context)


def make_sampling_params(ctx: ServingContext, max_tokens: int | None, **options: Any) -> SamplingParams:
    """SamplingParams with the server's caps; raises the typed errors (400) on bad values.

    ``max_tokens=None`` means the rest of the context (never ``SamplingParams``' default of 16)."""
    # Unset fields take the model's generation-config defaults, then SamplingParams'.
    options = with_sampling_defaults(options, engine_sampling_defaults(ctx.engine.engine))
    n = options.get("n", 1)
    if isinstance(n, int) and n > ctx.config.max_n:
        raise InvalidArgumentError(f"n={n} exceeds the maximum of {ctx.config.max_n}", param="n")
    stop = options.get("stop")
    if isinstance(stop, str):
        stop = options["stop"] = [stop]
    if stop:
        if len(stop) > ctx.config.max_stop_sequences:
            raise InvalidArgumentError(
                f"{len(stop)} stop sequences exceed the maximum of {ctx.config.max_stop_sequences}", param="stop"
            )
        if any(len(s) > ctx.config.max_stop_sequence_chars for s in stop):
            raise InvalidArgumentError(
                f"a stop sequence is longer than {ctx.config.max_stop_sequence_chars} characters", param="stop"
            )
    return SamplingParams(max_tokens=max_tokens, **options)


def check_admissible(ctx: ServingContext, params: SamplingParams, num_prompts: int = 1) -> None:
    """A request with more sequences than the server ever admits at once is a 400, not a 503 to retry."""
    cap = ctx.engine.config.max_inflight_seqs
    num_seqs = params.n * num_prompts
    if cap is not None and num_seqs > cap:
        asked = f"n={params.n}" if num_prompts == 1 else f"{num_prompts} prompts with n={params.n}"
        raise InvalidArgumentError(
            f"this request asks for {num_seqs} sequences ({asked}); the server admits at most {cap} at once",
            param="n",
        )


def with_adapter(ctx: ServingContext, options: RequestOptions, model: str | None) -> RequestOptions:
    """``options`` with the LoRA adapter ``model`` names, if it names one (--lora-modules)."""
    lora = ctx.lora_requests.get(model) if model is not None else None
    return options if lora is None else dataclasses.replace(options, lora_request=lora)


def check_request_options(ctx: ServingContext, options: RequestOptions) -> None:
    """A priority other than 0 needs the priority policy: a 400 before anything is admitted."""
    check_priority(options.priority, engine_capacity(ctx.engine.engine).scheduling_policy)


def check_prompt(
    ctx: ServingContext, prompt: PromptInput, params: SamplingParams, prompt_param: str = "prompt",
    max_tokens_param: str | None = "max_tokens",
) -> PromptInput:
    """The engine's own checks plus the one it does not make: prompt + max_tokens must fit.
    Returns the prompt as the engine will take it (cut where ``truncate_prompt_tokens`` asks).

    ``max_tokens_param`` names the field the client sent ``max_tokens`` as, or is
    None when it sent none: a default is capped at the rest of the context by the
    engine, never a reason to refuse, and errors name only what the client sent.
    (The offline engine caps ``max_tokens`` silently; a server refuses instead.)
    """
    max_model_len = ctx.limits.max_model_len
    if prompt.image_features:  # spans inside the prompt, within the limit, never truncated
        ctx.engine.engine.image_features(prompt.as_engine_prompt(), prompt.token_ids, params)
    if params.truncate_prompt_tokens is not None:  # the engine cuts the same way; untouched prompts are not copied
        prompt = PromptInput(*ctx.engine.engine.prepare_prompt(prompt.as_engine_prompt(), params))
    num_prompt_tokens = len(prompt.token_ids)
    if num_prompt_tokens >= max_model_len:
        raise prompt_too_long(num_prompt_tokens, max_model_len, prompt_param)
    ctx.engine.engine.validate(prompt.token_ids, params)
    if max_tokens_param is not None and params.max_tokens is not None:
        total = num_prompt_tokens + params.max_tokens
        if total > max_model_len:
            raise PromptTooLongError(
                f"this model's maximum context length is {max_model_len} tokens, but {num_prompt_tokens} prompt "
                f"tokens plus {max_tokens_param}={params.max_tokens} were requested ({total})",
                param=max_tokens_param,
            )
    return prompt


def new_request_id(prefix: str) -> str:
    """``cmpl-<hex>``; Anthropic's ids use an underscore (``msg_<hex>``), pass ``"msg_"``."""
    separator = "" if prefix.endswith("_") else "-"
    # The HTTP request's id (operations.RequestIdMiddleware), so that its log lines and its trace match.
    return f"{prefix}{separator}{current_request_id() or uuid.uuid4().hex}"


def unix_time() -> int:
    return int(time.time())


async def admit_all(
    ctx: ServingContext, request_id: str, prompts: list[PromptInput], params: SamplingParams,
    options: RequestOptions = RequestOptions(), model: str | None = None,
) -> list[RequestStream]:
    """Admit every prompt or none: on any failure the ones already admitted are aborted.
    ``model`` (from ``resolve_model``) may name a LoRA adapter: the prompts then run with it."""
    options = with_adapter(ctx, options, model)
    if ctx.config.enable_log_requests:
        log_requests(request_id, prompts, params, ctx.config.max_log_len)
    streams: list[RequestStream] = []
    try:
        for index, prompt in enumerate(prompts):
            engine_id = request_id if len(prompts) == 1 else f"{request_id}-{index}"
            streams.append(await ctx.engine.add_request(engine_id, prompt.as_engine_prompt(), params, options))
    except BaseException as exc:
        for stream in streams:
            ctx.engine.close(stream)
        if isinstance(exc, QueueFullError):
            ctx.metrics.requests_rejected.labels(reason="queue_full").inc()
        raise
    return streams


def log_requests(request_id: str, prompts: list[PromptInput], params: SamplingParams, max_log_len: int | None) -> None:
    """vLLM's --enable-log-requests: each prompt (text and ids, cut at ``max_log_len``) and its parameters."""
    for index, prompt in enumerate(prompts):
        text, ids = prompt.text, list(prompt.token_ids)
        if max_log_len is not None:
            text, ids = (text[:max_log_len] if text is not None else None), ids[:max_log_len]
        engine_id = request_id if len(prompts) == 1 else f"{request_id}-{index}"
        logger.info("received request %s: prompt: %r, params: %s, prompt_token_ids: %s", engine_id, text, params, ids)


async def merge_outputs(
    ctx: ServingContext, streams: list[RequestStream]
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Outputs of several streams as they come, tagged with the stream's position."""
    if len(streams) == 1:
        try:
            async for output in ctx.engine.outputs(streams[0]):
                yield 0, output
        finally:
            ctx.engine.close(streams[0])
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(position: int, stream: RequestStream) -> None:
        try:
            async for output in ctx.engine.outputs(stream):
                queue.put_nowait((position, output))
        except Exception as exc:
            queue.put_nowait((position, exc))
        finally:
            queue.put_nowait((position, done))

    tasks = [asyncio.create_task(pump(i, stream)) for i, stream in enumerate(streams)]
    try:
        num_open = len(tasks)
        while num_open:
            position, item = await queue.get()
            if item is done:
                num_open -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield position, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in streams:
            ctx.engine.close(stream)


async def final_outputs(ctx: ServingContext, streams: list[RequestStream]) -> list[RequestOutput]:
    """The finished output of each stream (final-only requests send just that one)."""
    finals: list[RequestOutput | None] = [None] * len(streams)
    async for position, output in merge_outputs(ctx, streams):
        if output.finished:
            finals[position] = output
    return finals  # type: ignore[return-value]


def sse(payload: dict, event: str | None = None) -> str:
    data = fast_json.dumps(payload)
    return f"event: {event}\ndata: {data}\n\n" if event else f"data: {data}\n\n"


class SSEResponse(StreamingResponse):
    """A server-sent-event stream that stops as soon as the client disconnects.

    Starlette only notices a disconnect when a write fails; this listens for
    it, so a request still waiting in the queue is aborted at once too.
    ``on_close`` runs on every way out (finished, disconnected, failed).
    """

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        # Plain asyncio tasks rather than an anyio task group: cancelling an
        # anyio scope formats the current task's repr (its callbacks' source
        # lines), a few percent of the API process at one request per stream.
        streaming = asyncio.ensure_future(self.stream_response(send))
        listening = asyncio.ensure_future(self.listen_for_disconnect(receive))
        try:
            done, _ = await asyncio.wait((streaming, listening), return_when=asyncio.FIRST_COMPLETED)
        finally:
            streaming.cancel()
            listening.cancel()
            await asyncio.gather(streaming, listening, return_exceptions=True)
            self.on_close()
        if streaming in done and streaming.exception() is not None:
            if not isinstance(streaming.exception(), OSError):  # OSError: the client went away mid-write
                raise streaming.exception()


async def unless_disconnected(request: Request, work: Any) -> Any:
    """Await ``work``; if the client disconnects first, cancel it (which aborts its requests)."""
    work_task = asyncio.ensure_future(work)
    watch_task = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({work_task, watch_task}, return_when=asyncio.FIRST_COMPLETED)
        if work_task in done:
            return work_task.result()
        raise RequestAbortedError("the client disconnected")
    finally:
        for task in (work_task, watch_task):
            task.cancel()
        await asyncio.gather(work_task, watch_task, return_exceptions=True)


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
