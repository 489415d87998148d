"""``POST /v1/chat/completions``: messages rendered with the chat template, n choices.

Streams open each choice with a ``{"role": "assistant", "content": ""}``
delta, then send content deltas (with ``logprobs.content`` when asked), the
``finish_reason`` on a choice's last chunk, an optional usage chunk, and
``[DONE]``; an engine failure mid-stream sends an error chunk and ``[DONE]``.

Tools, output constraints and template variables are resolved first
(``chat_features.py``); the text of each choice is read back into
``reasoning_content``, ``content`` and ``tool_calls`` by an ``OutputShaper``
(``chat_output.py``), delta by delta when streaming.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from octavo.core.outputs import CompletionOutput, RequestOutput
from octavo.core.sampling_params import RequestOutputKind
from octavo.entrypoints.async_engine import RequestStream
from octavo.entrypoints.failures import record_failure
from octavo.entrypoints.openai.beam_serving import beam_search, beam_search_params, length_check_params
from octavo.entrypoints.openai.chat_features import ChatFeatures, openai_chat_features, reasoning_effort_kwargs
from octavo.entrypoints.openai.chat_output import ChoiceMessage, OutputShaper, openai_delta, openai_message
from octavo.entrypoints.openai.chat_template import ChatOptions, collects_images, content_text
from octavo.entrypoints.openai.conversation import openai_conversation
from octavo.entrypoints.openai.errors import ApiError, from_octavo, openai_body
from octavo.entrypoints.openai.field_policy import check_undeclared_fields
from octavo.entrypoints.openai.logprobs import chat_logprobs, prompt_logprobs_json
from octavo.entrypoints.openai.openapi import add_json_route
from octavo.entrypoints.openai.prompts import PromptInput, encode_conversation, process_images, with_images
from octavo.entrypoints.openai.protocol import ChatCompletionRequest, ChatMessage, TokenizeRequest
from octavo.entrypoints.openai.responses import ChatCompletionResponse
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
from octavo.entrypoints.openai.structured import check_constraint
from octavo.errors import InvalidArgumentError, OctavoError


async def create_chat_completion(request: Request):
    ctx = get_context(request)
    body = await parse_body(request, ChatCompletionRequest)
    model = resolve_model(ctx, body.model)
    _reject_unsupported(body)
    features = openai_chat_features(ctx.config, body)
    features.template_kwargs.update(reasoning_effort_kwargs(ctx.tokenizer, body.reasoning_effort, "reasoning_effort"))
    features.keep_special_tokens_for(ctx.tokenizer, ctx.limits.eos_token_ids)
    if body.use_beam_search:
        return await _beam_search_chat(request, ctx, model, body, features)
    max_logprobs = ctx.limits.max_logprobs
    if body.top_logprobs is not None and not 0 <= body.top_logprobs <= max_logprobs:
        raise InvalidArgumentError(
            f"top_logprobs must be in [0, {max_logprobs}], got {body.top_logprobs}", param="top_logprobs"
        )
    max_tokens_param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    options = body.sampling_options()
    if options["skip_special_tokens"] is None:
        options["skip_special_tokens"] = features.skip_special_tokens
    params = make_sampling_params(
        ctx,
        max_tokens,  # None: the rest of the context
        **options,
        logprobs=(body.top_logprobs or 0) if body.logprobs else None,
        prompt_logprobs=body.prompt_logprobs,
        output_kind=RequestOutputKind.DELTA if body.stream else RequestOutputKind.FINAL_ONLY,
        structured_outputs=features.constraint,
    )
    check_admissible(ctx, params)
    request_options = body.request_options()
    check_request_options(ctx, request_options)
    prompt = await render_messages(ctx, body.messages, chat_options(body, features),
                                   fit_context=params.truncate_prompt_tokens is None)
    prompt = check_prompt(ctx, prompt, params, "messages", max_tokens_param if max_tokens is not None else None)
    await check_constraint(ctx.engine.engine, params, features.constraint_param)
    request_id = new_request_id("chatcmpl")
    streams = await admit_all(ctx, request_id, [prompt], params, request_options, model)
    builder = ChatBuilder(ctx, request_id, model, body, prompt, features)
    if body.stream:
        return SSEResponse(_stream(ctx, streams, builder), on_close=lambda: ctx.engine.close(streams[0]))
    try:
        finals = await unless_disconnected(request, final_outputs(ctx, streams))
    finally:
        ctx.engine.close(streams[0])
    return JSONResponse(builder.response(finals[0]))


async def _beam_search_chat(request: Request, ctx: ServingContext, model: str, body: ChatCompletionRequest,
                            features: ChatFeatures):
    if features.constraint is not None:
        raise InvalidArgumentError(f"{features.constraint_param} cannot be combined with use_beam_search",
                                   param=features.constraint_param)
    max_tokens_param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    params = beam_search_params(body, max_tokens, ctx.limits.max_logprobs)
    options = with_adapter(ctx, body.request_options(), model)
    check_request_options(ctx, options)
    prompt = await render_messages(ctx, body.messages, chat_options(body, features))
    prompt = check_prompt(ctx, prompt, length_check_params(params), "messages", max_tokens_param)
    request_id = new_request_id("chatcmpl")
    final = await unless_disconnected(request, beam_search(ctx, request_id, prompt, params, options))
    return JSONResponse(ChatBuilder(ctx, request_id, model, body, prompt, features).response(final))


def _reject_unsupported(body: ChatCompletionRequest) -> None:
    check_undeclared_fields(body, "chat")
    body.check_prompt_logprobs()
    if body.top_logprobs is not None and not body.logprobs:
        raise InvalidArgumentError("top_logprobs needs logprobs=true", param="top_logprobs")


def chat_options(body: ChatCompletionRequest | TokenizeRequest, features: ChatFeatures | None = None) -> ChatOptions:
    """``continue_final_message`` turns off the generation prompt unless the client asked for both."""
    continue_final = bool(body.continue_final_message)
    add_generation_prompt = body.add_generation_prompt is not False
    if continue_final and "add_generation_prompt" not in body.model_fields_set:
        add_generation_prompt = False
    features = features or ChatFeatures()
    # Special tokens on top of the template's only when sent (/tokenize's default of true is for prompts).
    add_special_tokens = "add_special_tokens" in body.model_fields_set and bool(body.add_special_tokens)
    return ChatOptions(
        add_generation_prompt, continue_final, features.tool_use.template_tools, features.template_kwargs,
        documents=getattr(body, "documents", None), add_special_tokens=add_special_tokens,
    )


async def render_messages(
    ctx: ServingContext, messages: list[ChatMessage], options: ChatOptions, fit_context: bool = True
) -> PromptInput:
    """Render and tokenise on the pool (the conversation is built there too: 100,000 messages take a while);
    then the images, on the image workers (``process_images``)."""
    image_prompts = getattr(ctx.engine.engine, "image_prompts", None)
    prompt = await ctx.pool.run(_render_messages, messages, options, ctx.prompt_limits, fit_context, image_prompts)
    return await process_images(prompt, image_prompts)


def _render_messages(
    tokenizer, messages: list[ChatMessage], options: ChatOptions, limits, fit_context: bool, image_prompts=None,
) -> PromptInput:
    images = collects_images(tokenizer, image_prompts)
    prompt = encode_conversation(tokenizer, openai_conversation(messages, images), options, limits, fit_context)
    return with_images(prompt, images)


class ChatBuilder:
    """Turns engine outputs into chat completion objects and stream chunks."""

    def __init__(
        self, ctx: ServingContext, request_id: str, model: str, body: ChatCompletionRequest, prompt, features: ChatFeatures
    ) -> None:
        self.ctx = ctx
        self.request_id = request_id
        self.model = model
        self.body = body
        self.prompt: PromptInput = prompt
        self.features = features
        self.with_reasoning = features.reasoning_parser is not None and body.include_reasoning is not False
        self.echo_text = _echo_text(body)
        self.created = unix_time()
        self.num_completion_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens read from the prefix cache
        self.shapers: dict[int, OutputShaper] = {}  # streaming: one per choice

    def _shaper(self, index: int) -> OutputShaper:
        if index not in self.shapers:
            self.shapers[index] = self.features.shaper()
        return self.shapers[index]

    def _logprobs(self, completion: CompletionOutput) -> dict | None:
        if not self.body.logprobs:
            return None
        entries = completion.logprobs or []
        return {"content": chat_logprobs(self.ctx.tokenizer, completion.token_ids, entries, self.body.top_logprobs or 0,
                                         tokens_as_ids(self.ctx, self.body))}

    def _envelope(self, object_type: str, choices: list[dict]) -> dict:
        return {
            "id": self.request_id,
            "object": object_type,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "system_fingerprint": None,
        }

    def usage(self) -> dict:
        num_prompt_tokens = len(self.prompt.token_ids)
        return {
            "prompt_tokens": num_prompt_tokens,
            "completion_tokens": self.num_completion_tokens,
            "total_tokens": num_prompt_tokens + self.num_completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.num_cached_tokens},
        }

    def response(self, final: RequestOutput) -> dict:
        self.num_cached_tokens = final.num_cached_tokens
        choices = []
        for completion in sorted(final.outputs, key=lambda c: c.index):
            self.num_completion_tokens += len(completion.token_ids)
            shaper, message = self.features.shaper(), ChoiceMessage()
            message.add(shaper.feed(completion.text))
            message.add(shaper.finish())
            choices.append(self._with_token_ids(
                {
                    "index": completion.index,
                    "message": self._echoed(openai_message(message, self.with_reasoning)),
                    "logprobs": self._logprobs(completion),
                    "finish_reason": shaper.finish_reason(completion.finish_reason),
                    "stop_reason": completion.stop_reason,
                },
                completion,
            ))
        answer = {**self._envelope("chat.completion", choices), "usage": self.usage(), **self._prompt_token_ids()}
        if self.body.prompt_logprobs is not None:
            answer["prompt_logprobs"] = prompt_logprobs_json(
                self.ctx.tokenizer, self.prompt.token_ids, final.prompt_logprobs, self.body.prompt_logprobs,
                tokens_as_ids(self.ctx, self.body))
        return answer

    def _echoed(self, message: dict) -> dict:
        if self.echo_text:
            message["content"] = self.echo_text + (message["content"] or "")
        return message

    def _with_token_ids(self, choice: dict, completion: CompletionOutput) -> dict:
        """vLLM's ``return_token_ids``: the choice's ids (a stream's: this chunk's), stop token included."""
        if self.body.return_token_ids:
            choice["token_ids"] = list(completion.token_ids)
        return choice

    def _prompt_token_ids(self) -> dict:
        return {"prompt_token_ids": list(self.prompt.token_ids)} if self.body.return_token_ids else {}

    def role_chunk(self) -> dict:
        choices = [
            {"index": index, "delta": {"role": "assistant", "content": self.echo_text}, "logprobs": None,
             "finish_reason": None, **({"token_ids": []} if self.body.return_token_ids else {})}
            for index in range(self.body.n or 1)
        ]
        return {**self._envelope("chat.completion.chunk", choices), **self._prompt_token_ids()}

    def chunk(self, output: RequestOutput) -> dict | None:
        self.num_cached_tokens = output.num_cached_tokens
        choices = []
        for completion in output.outputs:
            if not (completion.token_ids or completion.text or completion.finish_reason):
                continue
            self.num_completion_tokens += len(completion.token_ids)
            shaper = self._shaper(completion.index)
            shaped = shaper.feed(completion.text)
            if completion.finish_reason:
                shaped = shaped.joined(shaper.finish())
            if not self.with_reasoning:
                shaped.reasoning = ""  # parsed out of the answer, and not sent (include_reasoning: false)
            delta = openai_delta(shaped)
            logprobs = self._logprobs(completion)
            if not delta and not completion.finish_reason and logprobs is None and not self.body.return_token_ids:
                continue  # held back (a possible tag), nothing to send yet
            choices.append(self._with_token_ids(
                {
                    "index": completion.index,
                    "delta": delta,
                    "logprobs": logprobs,
                    "finish_reason": shaper.finish_reason(completion.finish_reason),
                    "stop_reason": completion.stop_reason,
                },
                completion,
            ))
        return self._envelope("chat.completion.chunk", choices) if choices else None

    def usage_chunk(self) -> dict:
        return {**self._envelope("chat.completion.chunk", []), "usage": self.usage()}


def _echo_text(body: ChatCompletionRequest) -> str:
    """vLLM's ``echo``: the last message's text, when it is the assistant's (the answer continues it)."""
    last = body.messages[-1]
    if not body.echo or last.role != "assistant":
        return ""
    return content_text(last.content, f"messages.{len(body.messages) - 1}.content")


async def _stream(ctx: ServingContext, streams: list[RequestStream], builder: ChatBuilder) -> AsyncIterator[str]:
    try:
        yield sse(builder.role_chunk())
        async for _, output in merge_outputs(ctx, streams):
            chunk = builder.chunk(output)
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
        app, "/v1/chat/completions", create_chat_completion, body=ChatCompletionRequest,
        response=ChatCompletionResponse, streams=True,
    )
