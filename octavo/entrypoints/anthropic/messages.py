"""``POST /v1/messages``: the Anthropic Messages API on the same engine.

A stream is the documented event sequence: ``message_start``,
``content_block_start``, ``content_block_delta``* , ``content_block_stop``,
``message_delta`` (stop reason, output tokens), ``message_stop``. Errors on
this route, in a stream or not, use Anthropic's error shape (the stream sends
an ``error`` event and ends).

A last ``assistant`` message is a prefill: the conversation is rendered
without a new turn and the answer continues that message (the response
holds only the continuation, as Anthropic's does).

Tools, tool results, thinking and output constraints are resolved as for
OpenAI chat (``conversation.py``, ``openai/chat_features.py``); the output is
read back into ``thinking``, ``text`` and ``tool_use`` blocks (``output.py``),
with ``stop_reason: tool_use`` after tool calls.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from octavo.core.sampling_params import RequestOutputKind
from octavo.entrypoints.anthropic.conversation import anthropic_conversation, anthropic_features, prompt_features
from octavo.entrypoints.anthropic.output import BlockStream, content_blocks, stop_info
from octavo.entrypoints.anthropic.protocol import (
    ConversationFields,
    CountTokensRequest,
    CountTokensResponse,
    MessageResponse,
    MessagesRequest,
)
from octavo.entrypoints.async_engine import RequestStream
from octavo.entrypoints.failures import record_failure
from octavo.entrypoints.openai.chat_features import ChatFeatures
from octavo.entrypoints.openai.chat_output import ChoiceMessage
from octavo.entrypoints.openai.chat_template import ChatOptions, collects_images
from octavo.entrypoints.openai.errors import ApiError, anthropic_body, from_octavo
from octavo.entrypoints.openai.field_policy import check_undeclared_fields
from octavo.entrypoints.openai.openapi import add_json_route
from octavo.entrypoints.openai.prompts import PromptInput, PromptLimits, encode_conversation, process_images, with_images
from octavo.entrypoints.openai.serving import (
    ServingContext,
    SSEResponse,
    admit_all,
    check_admissible,
    check_prompt,
    final_outputs,
    get_context,
    make_sampling_params,
    merge_outputs,
    new_request_id,
    parse_body,
    resolve_model,
    sse,
    unless_disconnected,
)
from octavo.entrypoints.openai.structured import check_constraint
from octavo.errors import OctavoError


async def create_message(request: Request):
    ctx = get_context(request)
    body = await parse_body(request, MessagesRequest)
    model = resolve_model(ctx, body.model)
    check_undeclared_fields(body, "messages")
    features = anthropic_features(ctx.config, body)
    features.keep_special_tokens_for(ctx.tokenizer, ctx.limits.eos_token_ids)
    params = make_sampling_params(
        ctx,
        body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        stop=body.stop_sequences,
        skip_special_tokens=features.skip_special_tokens,
        output_kind=RequestOutputKind.DELTA if body.stream else RequestOutputKind.FINAL_ONLY,
        structured_outputs=features.constraint,
    )
    check_admissible(ctx, params)
    image_prompts = getattr(ctx.engine.engine, "image_prompts", None)
    prompt = await ctx.pool.run(render_conversation, body, features, ctx.prompt_limits, image_prompts)
    prompt = await process_images(prompt, image_prompts)
    check_prompt(ctx, prompt, params, "messages", "max_tokens")
    await check_constraint(ctx.engine.engine, params, features.constraint_param)
    message_id = new_request_id("msg_")
    streams = await admit_all(ctx, message_id, [prompt], params, model=model)
    if body.stream:
        events = _stream(ctx, streams[0], message_id, model, len(prompt.token_ids), features)
        return SSEResponse(events, on_close=lambda: ctx.engine.close(streams[0]))
    try:
        finals = await unless_disconnected(request, final_outputs(ctx, streams))
    finally:
        ctx.engine.close(streams[0])
    completion = finals[0].outputs[0]
    shaper, message = features.shaper(), ChoiceMessage()
    message.add(shaper.feed(completion.text))
    message.add(shaper.finish())
    stop_reason, stop_sequence = stop_info(completion, shaper)
    usage = {"cache_read_input_tokens": finals[0].num_cached_tokens}
    return JSONResponse(
        {
            **_message(message_id, model, len(prompt.token_ids), len(completion.token_ids), usage),
            "content": content_blocks(message),
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
        }
    )


def render_conversation(
    tokenizer, body: ConversationFields, features: ChatFeatures, limits: PromptLimits, image_prompts=None,
) -> PromptInput:
    """The prompt of a Messages request (on a tokenizer-pool worker; its images collected for ``process_images``)."""
    prefill = body.messages[-1].role == "assistant"
    options = ChatOptions(
        add_generation_prompt=not prefill, continue_final_message=prefill,
        tools=features.tool_use.template_tools, template_kwargs=features.template_kwargs,
    )
    images = collects_images(tokenizer, image_prompts)
    prompt = encode_conversation(tokenizer, anthropic_conversation(body, images), options, limits)
    return with_images(prompt, images)


async def count_tokens(request: Request):
    """``POST /v1/messages/count_tokens``: the prompt's length, as the messages route would render it."""
    ctx = get_context(request)
    body = await parse_body(request, CountTokensRequest)
    resolve_model(ctx, body.model)
    check_undeclared_fields(body, "messages")
    image_prompts = getattr(ctx.engine.engine, "image_prompts", None)
    prompt = await ctx.pool.run(render_conversation, body, prompt_features(ctx.config, body), ctx.prompt_limits,
                                image_prompts)
    prompt = await process_images(prompt, image_prompts)
    return JSONResponse({"input_tokens": len(prompt.token_ids)})


def _message(message_id: str, model: str, num_input_tokens: int, num_output_tokens: int, usage: dict | None = None) -> dict:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": num_input_tokens, "output_tokens": num_output_tokens, **(usage or {})},
    }


async def _stream(
    ctx: ServingContext, stream: RequestStream, message_id: str, model: str, num_input_tokens: int, features: ChatFeatures
) -> AsyncIterator[str]:
    num_output_tokens = 0
    shaper, blocks = features.shaper(), BlockStream()
    try:
        yield sse({"type": "message_start", "message": _message(message_id, model, num_input_tokens, 0)}, "message_start")
        async for _, output in merge_outputs(ctx, [stream]):
            completion = output.outputs[0]
            num_output_tokens += len(completion.token_ids)
            events = blocks.events(shaper.feed(completion.text))
            if completion.finish_reason is not None:
                events += blocks.events(shaper.finish()) + blocks.close()
            for event, payload in events:
                yield sse(payload, event)
            if completion.finish_reason is not None:
                stop_reason, stop_sequence = stop_info(completion, shaper)
                message_delta = {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                    # The prompt tokens the prefix cache served, known once the request ran.
                    "usage": {"output_tokens": num_output_tokens, "cache_read_input_tokens": output.num_cached_tokens},
                }
                yield sse(message_delta, "message_delta")
                yield sse({"type": "message_stop"}, "message_stop")
    except OctavoError as exc:
        record_failure(ctx.metrics, message_id, exc)
        yield sse(anthropic_body(from_octavo(exc)), "error")
    except Exception as exc:
        record_failure(ctx.metrics, message_id, exc)
        yield sse(anthropic_body(ApiError(500, f"internal server error: {type(exc).__name__}")), "error")


def add_routes(app: FastAPI) -> None:
    add_json_route(
        app, "/v1/messages", create_message, body=MessagesRequest, response=MessageResponse, streams=True,
        anthropic=True,
    )
    add_json_route(
        app, "/v1/messages/count_tokens", count_tokens, body=CountTokensRequest, response=CountTokensResponse,
        anthropic=True,
    )
