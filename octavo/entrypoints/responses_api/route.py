"""``POST /v1/responses`` (OpenAI's Responses API) on the same engine, and the
stored responses: ``GET`` and ``DELETE /v1/responses/{id}``, ``GET
/v1/responses/{id}/input_items``.

A request's ``input`` (text or items) follows the conversation of its
``previous_response_id`` (when given) and ``instructions``; it is rendered
with the chat template like a chat request, and tools, tool choice, reasoning
and ``text.format`` work as they do there (``conversation.py``). A stream is
the documented event sequence: ``response.created``, ``response.in_progress``,
the items' events (``output.py``), then ``response.completed`` (or
``response.incomplete`` when ``max_output_tokens`` cut it); a failure sends an
``error`` event and ``response.failed``. ``background: true`` answers at once
and generates in a task (``background.py``). Errors use OpenAI's error object.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse

from octavo.core.sampling_params import RequestOutputKind
from octavo.entrypoints.async_engine import RequestStream
from octavo.entrypoints.failures import record_failure
from octavo.entrypoints.openai.chat_features import ChatFeatures, reasoning_effort_kwargs
from octavo.entrypoints.openai.chat_template import ChatOptions, collects_images
from octavo.entrypoints.openai.errors import ApiError, from_octavo
from octavo.entrypoints.openai.openapi import add_json_route
from octavo.entrypoints.openai.prompts import PromptInput, PromptLimits, encode_conversation, process_images, with_images
from octavo.entrypoints.openai.serving import (
    ServingContext,
    SSEResponse,
    admit_all,
    check_admissible,
    check_prompt,
    check_request_options,
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
from octavo.entrypoints.responses_api.builder import ResponseBuilder
from octavo.entrypoints.responses_api.checks import reject_unsupported, wants_stored
from octavo.entrypoints.responses_api.conversation import ConversationBuilder, request_items, responses_features
from octavo.entrypoints.responses_api.protocol import (
    DeletedResponse,
    InputItemList,
    ResponseObject,
    ResponsesRequest,
)
from octavo.entrypoints.responses_api.store import ResponseStore
from octavo.errors import OctavoError


def get_store(request: Request) -> ResponseStore:
    return request.app.state.octavo_responses


async def create_response(request: Request):
    ctx, store = get_context(request), get_store(request)
    body = await parse_body(request, ResponsesRequest)
    model = resolve_model(ctx, body.model)
    reject_unsupported(body, ctx.limits.max_logprobs)
    keep = wants_stored(body, store)
    features = responses_features(ctx.config, body)
    effort = body.reasoning.effort if body.reasoning is not None else None
    features.template_kwargs.update(reasoning_effort_kwargs(ctx.tokenizer, effort, "reasoning.effort"))
    features.keep_special_tokens_for(ctx.tokenizer, ctx.limits.eos_token_ids)
    wants_logprobs = body.top_logprobs is not None or "message.output_text.logprobs" in (body.include or [])
    params = make_sampling_params(
        ctx, body.max_output_tokens, **body.knob_options(),
        skip_special_tokens=features.skip_special_tokens,
        logprobs=(body.top_logprobs or 0) if wants_logprobs else None,
        # A background run keeps its events for streams that follow it.
        output_kind=RequestOutputKind.DELTA if body.stream or body.background else RequestOutputKind.FINAL_ONLY,
        structured_outputs=features.constraint,
    )
    check_admissible(ctx, params)
    check_request_options(ctx, body.request_options())
    items = request_items(body)
    history = []
    if body.previous_response_id is not None:
        history = store.history(body.previous_response_id, ctx.prompt_limits.max_prompt_chars)
    image_prompts = getattr(ctx.engine.engine, "image_prompts", None)
    prompt = await ctx.pool.run(render_items, body.instructions, history, items, features, ctx.prompt_limits,
                                image_prompts)
    prompt = await process_images(prompt, image_prompts, "input")
    check_prompt(ctx, prompt, params, "input", "max_output_tokens" if body.max_output_tokens is not None else None)
    await check_constraint(ctx.engine.engine, params, features.constraint_param)
    response_id = new_request_id("resp_")
    streams = await admit_all(ctx, response_id, [prompt], params, body.request_options(), model)
    builder = ResponseBuilder(ctx, response_id, model, body, params, len(prompt.token_ids), features, keep)
    if body.background:
        run = request.app.state.octavo_background.start(ctx, store, streams[0], builder, items)
        if body.stream:  # the run goes on if this client leaves
            return SSEResponse(run.follow(), on_close=lambda: None)
        return JSONResponse(builder.response())
    if body.stream:
        events = _stream(ctx, streams[0], builder, store, items)
        return SSEResponse(events, on_close=lambda: ctx.engine.close(streams[0]))
    try:
        finals = await unless_disconnected(request, final_outputs(ctx, streams))
    finally:
        ctx.engine.close(streams[0])
    builder.feed(finals[0])
    return JSONResponse(builder.save(store, items))


def render_items(
    tokenizer, instructions: str | None, history: list[dict], items: list[dict], features: ChatFeatures,
    limits: PromptLimits, image_prompts=None,
) -> PromptInput:
    """The prompt of a Responses request (on a tokenizer-pool worker; its images collected for ``process_images``)."""
    images = collects_images(tokenizer, image_prompts)
    builder = ConversationBuilder(instructions, images)
    for index, item in enumerate(history):
        builder.add(item, f"previous_response_id.{index}")
    for index, item in enumerate(items):
        builder.add(item, f"input.{index}")
    options = ChatOptions(tools=features.tool_use.template_tools, template_kwargs=features.template_kwargs)
    prompt = encode_conversation(tokenizer, builder.rendered_turns(), options, limits, param="input")
    return with_images(prompt, images)


async def _stream(
    ctx: ServingContext, stream: RequestStream, builder: ResponseBuilder, store: ResponseStore, items: list[dict]
) -> AsyncIterator[str]:
    try:
        for event in builder.opening_events():
            yield _sse(builder, event)
        async for _, output in merge_outputs(ctx, [stream]):
            events = builder.feed(output)
            if output.finished:  # the stored answer (store false where it did not fit)
                events[-1]["response"] = builder.save(store, items)
            for event in events:
                yield _sse(builder, event)
    except OctavoError as exc:
        record_failure(ctx.metrics, builder.response_id, exc)
        for event in _failure(builder, from_octavo(exc)):
            yield _sse(builder, event)
    except Exception as exc:
        record_failure(ctx.metrics, builder.response_id, exc)
        for event in _failure(builder, ApiError(500, f"internal server error: {type(exc).__name__}", "internal_error")):
            yield _sse(builder, event)


def _sse(builder: ResponseBuilder, event: dict) -> str:
    return sse(builder.numbered(event), event["type"])


def _failure(builder: ResponseBuilder, error: ApiError) -> list[dict]:
    code = error.code or "server_error"
    return [{"type": "error", "code": code, "message": error.message, "param": error.param},
            builder.failed_event(code, error.message)]


# ---------------------------------------------------------------- stored


async def retrieve_response(request: Request, response_id: str, stream: bool = False, starting_after: int = -1):
    """The stored response; with ``stream``, a running background response's events after ``starting_after``."""
    store = get_store(request)
    if stream:
        run = request.app.state.octavo_background.following(store, response_id)
        return SSEResponse(run.follow(starting_after), on_close=lambda: None)
    return JSONResponse(store.get(response_id).response)


async def cancel_response(request: Request, response_id: str):
    return JSONResponse(await request.app.state.octavo_background.cancel(get_store(request), response_id))


async def delete_response(request: Request, response_id: str):
    store = get_store(request)
    store.get(response_id)  # 404 if unknown
    store.delete(response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


async def list_input_items(
    request: Request, response_id: str, limit: int = Query(20, ge=1, le=100),
    order: Literal["asc", "desc"] = "desc", after: str | None = None,
):
    """This response's own input items (not its chain's), OpenAI's list shape."""
    items = list(get_store(request).get(response_id).input_items)
    if order == "desc":
        items.reverse()
    if after is not None:
        position = next((i for i, item in enumerate(items) if item.get("id") == after), None)
        items = items[position + 1:] if position is not None else []
    page = items[:limit]
    return JSONResponse({
        "object": "list", "data": page, "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit,
    })


def add_routes(app: FastAPI) -> None:
    add_json_route(app, "/v1/responses", create_response, body=ResponsesRequest, response=ResponseObject, streams=True)
    add_json_route(app, "/v1/responses/{response_id}", retrieve_response, methods=["GET"], body=None,
                   response=ResponseObject, statuses=[400, 401, 404], streams=True)
    add_json_route(app, "/v1/responses/{response_id}", delete_response, methods=["DELETE"], body=None,
                   response=DeletedResponse, statuses=[401, 404])
    add_json_route(app, "/v1/responses/{response_id}/cancel", cancel_response, body=None, response=ResponseObject,
                   statuses=[400, 401, 404])
    add_json_route(app, "/v1/responses/{response_id}/input_items", list_input_items, methods=["GET"], body=None,
                   response=InputItemList, statuses=[400, 401, 404])
