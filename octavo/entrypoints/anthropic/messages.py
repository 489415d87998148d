"""``POST /v1/messages``: the Anthropic Messages API on the same engine.

A stream is the documented event sequence: ``message_start``,
``content_block_start``, ``content_block_delta``* , ``content_block_stop``,
``message_delta`` (stop reason, output tokens), ``message_stop``. Errors on
this route, in a stream or not, use Anthropic's error shape (the stream sends
an ``error`` event and ends).

A last ``assistant`` message is a prefill: the conversation is rendered
without a new turn and the answer continues that message (the response
holds only the continuation, as Anthropic's does).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from octavo.core.outputs import CompletionOutput
from octavo.core.sampling_params import RequestOutputKind
from octavo.entrypoints.anthropic.protocol import MessageResponse, MessagesRequest
from octavo.entrypoints.async_engine import RequestStream
from octavo.entrypoints.openai.chat_template import ChatOptions, content_text
from octavo.entrypoints.openai.errors import ApiError, anthropic_body, from_octavo
from octavo.entrypoints.openai.openapi import add_json_route
from octavo.entrypoints.openai.prompts import PromptInput, PromptLimits, encode_conversation
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
from octavo.errors import OctavoError

logger = logging.getLogger(__name__)


async def create_message(request: Request):
    ctx = get_context(request)
    body = await parse_body(request, MessagesRequest)
    model = resolve_model(ctx, body.model)
    params = make_sampling_params(
        ctx,
        body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        stop=body.stop_sequences,
        output_kind=RequestOutputKind.DELTA if body.stream else RequestOutputKind.FINAL_ONLY,
    )
    check_admissible(ctx, params)
    prompt = await ctx.pool.run(render_conversation, body, ctx.prompt_limits)
    check_prompt(ctx, prompt, params, "messages", "max_tokens")
    message_id = new_request_id("msg_")
    streams = await admit_all(ctx, message_id, [prompt], params)
    if body.stream:
        events = _stream(ctx, streams[0], message_id, model, len(prompt.token_ids))
        return SSEResponse(events, on_close=lambda: ctx.engine.close(streams[0]))
    try:
        finals = await unless_disconnected(request, final_outputs(ctx, streams))
    finally:
        ctx.engine.close(streams[0])
    completion = finals[0].outputs[0]
    stop_reason, stop_sequence = stop_info(completion)
    return JSONResponse(
        {
            **_message(message_id, model, len(prompt.token_ids), len(completion.token_ids)),
            "content": [{"type": "text", "text": completion.text}],
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
        }
    )


def render_conversation(tokenizer, body: MessagesRequest, limits: PromptLimits) -> PromptInput:
    """The prompt of a Messages request (on a tokenizer-pool worker)."""
    conversation = []
    if body.system:
        conversation.append({"role": "system", "content": content_text(body.system, "system")})
    for position, message in enumerate(body.messages):
        conversation.append({"role": message.role, "content": content_text(message.content, f"messages.{position}.content")})
    prefill = body.messages[-1].role == "assistant"
    options = ChatOptions(add_generation_prompt=not prefill, continue_final_message=prefill)
    return encode_conversation(tokenizer, conversation, options, limits)


def stop_info(completion: CompletionOutput) -> tuple[str, str | None]:
    if completion.finish_reason == "length":
        return "max_tokens", None
    if isinstance(completion.stop_reason, str):
        return "stop_sequence", completion.stop_reason
    return "end_turn", None


def _message(message_id: str, model: str, num_input_tokens: int, num_output_tokens: int) -> dict:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": num_input_tokens, "output_tokens": num_output_tokens},
    }


async def _stream(
    ctx: ServingContext, stream: RequestStream, message_id: str, model: str, num_input_tokens: int
) -> AsyncIterator[str]:
    num_output_tokens = 0
    try:
        yield sse({"type": "message_start", "message": _message(message_id, model, num_input_tokens, 0)}, "message_start")
        start = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
        yield sse(start, "content_block_start")
        async for _, output in merge_outputs(ctx, [stream]):
            completion = output.outputs[0]
            num_output_tokens += len(completion.token_ids)
            if completion.text:
                delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": completion.text}}
                yield sse(delta, "content_block_delta")
            if completion.finish_reason is not None:
                yield sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
                stop_reason, stop_sequence = stop_info(completion)
                message_delta = {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                    "usage": {"output_tokens": num_output_tokens},
                }
                yield sse(message_delta, "message_delta")
                yield sse({"type": "message_stop"}, "message_stop")
    except OctavoError as exc:
        yield sse(anthropic_body(from_octavo(exc)), "error")
    except Exception as exc:
        logger.exception("message stream %s failed", message_id)
        yield sse(anthropic_body(ApiError(500, f"internal server error: {type(exc).__name__}")), "error")


def add_routes(app: FastAPI) -> None:
    add_json_route(
        app, "/v1/messages", create_message, body=MessagesRequest, response=MessageResponse, streams=True,
        anthropic=True,
    )
