"""The small routes: models, health, version, metrics, tokenize, detokenize."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from octavo.core.engine import check_token_ids
from octavo.entrypoints.metrics import CONTENT_TYPE
from octavo.entrypoints.openai.chat import chat_options, render_messages
from octavo.entrypoints.openai.chat_features import features_for
from octavo.entrypoints.openai.conversation import template_kwargs
from octavo.entrypoints.openai.errors import ApiError, error_response, from_octavo
from octavo.entrypoints.openai.openapi import add_json_route
from octavo.entrypoints.openai.field_policy import check_undeclared_fields
from octavo.entrypoints.openai.protocol import DetokenizeRequest, TokenizeRequest
from octavo.entrypoints.openai.responses import (
    DetokenizeResponse,
    HealthResponse,
    ModelCard,
    ModelList,
    ResetResponse,
    TokenizeResponse,
    VersionResponse,
)
from octavo.entrypoints.openai.serving import ServingContext, encode_prompt, get_context, parse_body, resolve_model
from octavo.entrypoints.openai.tools import ToolUse, parse_tools
from octavo.errors import EngineDeadError, InvalidArgumentError, ModelNotFoundError, PrefixCacheBusyError
from octavo.version import __version__


def _model_card(ctx: ServingContext, name: str) -> dict:
    # ``root`` is the model as the operator named it, never a resolved path on this machine.
    card = {
        "id": name,
        "object": "model",
        "created": ctx.engine.started_at,
        "owned_by": "octavo",
        "root": ctx.config.model_root or ctx.config.model_name,
        "max_model_len": ctx.limits.max_model_len,
    }
    if name in ctx.lora_requests:  # an adapter (vLLM's card): its directory as given, on the base model
        card.update(root=ctx.lora_requests[name].lora_path, parent=ctx.config.model_name)
    return card


def _model_names(ctx: ServingContext) -> list[str]:
    return [*ctx.config.served_model_names, *ctx.lora_requests]


async def list_models(request: Request):
    ctx = get_context(request)
    return JSONResponse({"object": "list", "data": [_model_card(ctx, name) for name in _model_names(ctx)]})


async def retrieve_model(request: Request, model_id: str):
    ctx = get_context(request)
    if model_id not in _model_names(ctx):
        raise ModelNotFoundError(f"the model `{model_id}` does not exist", param="model")
    return JSONResponse(_model_card(ctx, model_id))


async def health(request: Request):
    ctx = get_context(request)
    if ctx.engine.is_alive:
        return JSONResponse({"status": "ok"})
    error = ctx.engine.error or EngineDeadError("the engine is not running")
    return error_response(request.url.path, from_octavo(error))


async def version():
    return JSONResponse({"version": __version__})


async def metrics(request: Request):
    ctx = get_context(request)
    snapshot = await ctx.engine.get_snapshot()
    ctx.metrics.update_engine_stats(snapshot, ctx.engine.is_alive, ctx.engine.num_inflight_seqs)
    store, background = request.app.state.octavo_responses, request.app.state.octavo_background
    ctx.metrics.update_response_store(len(store.entries), store.num_bytes, len(background.tasks))
    return Response(ctx.metrics.render(), media_type=CONTENT_TYPE)


async def reset_prefix_cache(request: Request):
    """vLLM's ``POST /reset_prefix_cache``: every replica forgets its cached prefixes (409 while requests
    hold blocks: nothing is forgotten then)."""
    if not await get_context(request).engine.reset_prefix_cache():
        raise PrefixCacheBusyError("requests are running: the prefix cache was left as it is; retry when idle")
    return JSONResponse({"reset": True})


async def tokenize(request: Request):
    ctx = get_context(request)
    body = await parse_body(request, TokenizeRequest)
    check_undeclared_fields(body, "tokenize")
    resolve_model(ctx, body.model)
    if (body.prompt is None) == (body.messages is None):
        raise InvalidArgumentError("send exactly one of prompt and messages", param="prompt")
    # Any length is counted (that is what clients ask /tokenize for); the character limit still applies.
    if body.messages is not None:
        # What the template sees, as the chat route builds it (the server's default variables included).
        tool_use = ToolUse(tools=parse_tools(body.tools))
        features = features_for(ctx.config, tool_use, None, None, template_kwargs(body.chat_template_kwargs))
        prompt = await render_messages(ctx, body.messages, chat_options(body, features), fit_context=False)
    elif body.tools or body.chat_template_kwargs or body.documents:
        raise InvalidArgumentError("tools, chat_template_kwargs and documents go with messages", param="prompt")
    else:
        prompt = await encode_prompt(ctx, body.prompt, body.add_special_tokens is not False, fit_context=False)
    token_ids = prompt.token_ids
    answer = {"count": len(token_ids), "max_model_len": ctx.limits.max_model_len, "tokens": token_ids}
    if body.return_token_strs:
        answer["token_strs"] = ctx.tokenizer.convert_ids_to_tokens(token_ids)
    return JSONResponse(answer)


async def detokenize(request: Request):
    ctx = get_context(request)
    body = await parse_body(request, DetokenizeRequest)
    check_undeclared_fields(body, "detokenize")
    resolve_model(ctx, body.model)
    check_token_ids(body.tokens, ctx.limits.vocab_size, "tokens")
    if ctx.tokenizer is None:
        return error_response(request.url.path, ApiError(400, "this server has no tokenizer", param="tokens"))
    return JSONResponse({"prompt": await ctx.pool.run(_decode, body.tokens)})


def _decode(tokenizer, token_ids: list[int]) -> str:
    return tokenizer.decode(token_ids)


def add_routes(app: FastAPI) -> None:
    add_json_route(app, "/v1/models", list_models, methods=["GET"], body=None, response=ModelList, statuses=[401])
    add_json_route(
        app, "/v1/models/{model_id:path}", retrieve_model, methods=["GET"], body=None, response=ModelCard,
        statuses=[401, 404],
    )
    add_json_route(app, "/health", health, methods=["GET"], body=None, response=HealthResponse, statuses=[503])
    # HEAD: the same status, no body (load balancers' probes).
    app.add_api_route("/health", health, methods=["HEAD"], operation_id="health_head", response_model=None)
    add_json_route(app, "/version", version, methods=["GET"], body=None, response=VersionResponse, statuses=[])
    app.add_api_route(
        "/metrics", metrics, methods=["GET"], response_class=PlainTextResponse,
        responses={200: {"description": "Prometheus text format"}, 401: {"description": "missing or wrong API key"}},
    )
    add_json_route(app, "/tokenize", tokenize, body=TokenizeRequest, response=TokenizeResponse)
    add_json_route(app, "/reset_prefix_cache", reset_prefix_cache, body=None, response=ResetResponse,
                   statuses=[401, 409, 503])
    add_json_route(app, "/detokenize", detokenize, body=DetokenizeRequest, response=DetokenizeResponse)
