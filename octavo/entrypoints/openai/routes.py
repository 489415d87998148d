"""The small routes: models, health, version, metrics, tokenize, detokenize."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from octavo.entrypoints.metrics import CONTENT_TYPE
from octavo.entrypoints.openai.chat import render_messages
from octavo.entrypoints.openai.errors import ApiError, error_response, from_octavo
from octavo.entrypoints.openai.protocol import DetokenizeRequest, TokenizeRequest
from octavo.entrypoints.openai.serving import ServingContext, encode_text, get_context, parse_body, resolve_model
from octavo.errors import EngineDeadError, InvalidArgumentError, ModelNotFoundError
from octavo.version import __version__



def _model_card(ctx: ServingContext, name: str) -> dict:
    return {
        "id": name,
        "object": "model",
        "created": ctx.engine.started_at,
        "owned_by": "octavo",
        "root": ctx.engine.engine.info.model_path if ctx.engine.engine.info else name,
        "max_model_len": ctx.limits.max_model_len,
    }


async def list_models(request: Request):
    ctx = get_context(request)
    return {"object": "list", "data": [_model_card(ctx, name) for name in ctx.config.served_model_names]}


async def retrieve_model(request: Request, model_id: str):
    ctx = get_context(request)
    if model_id not in ctx.config.served_model_names:
        raise ModelNotFoundError(f"the model `{model_id}` does not exist", param="model")
    return _model_card(ctx, model_id)


async def health(request: Request):
    ctx = get_context(request)
    if ctx.engine.is_alive:
        return JSONResponse({"status": "ok"})
    error = ctx.engine.error or EngineDeadError("the engine is not running")
    return error_response(request.url.path, from_octavo(error))


async def version():
    return {"version": __version__}


async def metrics(request: Request):
    ctx = get_context(request)
    snapshot = await ctx.engine.get_snapshot()
    ctx.metrics.update_engine_stats(snapshot, ctx.engine.is_alive, ctx.engine.num_inflight_seqs)
    return Response(ctx.metrics.render(), media_type=CONTENT_TYPE)


async def tokenize(request: Request):
    ctx = get_context(request)
    body = await parse_body(request, TokenizeRequest)
    resolve_model(ctx, body.model)
    if (body.prompt is None) == (body.messages is None):
        raise InvalidArgumentError("send exactly one of prompt and messages", param="prompt")
    if body.messages is not None:
        token_ids = render_messages(ctx, body.messages, body.add_generation_prompt is not False).token_ids
    else:
        token_ids = encode_text(ctx, body.prompt, body.add_special_tokens is not False).token_ids
    return {"count": len(token_ids), "max_model_len": ctx.limits.max_model_len, "tokens": token_ids}


async def detokenize(request: Request):
    ctx = get_context(request)
    body = await parse_body(request, DetokenizeRequest)
    resolve_model(ctx, body.model)
    vocab_size = ctx.limits.vocab_size
    bad = [t for t in body.tokens if not 0 <= t < vocab_size]
    if bad:
        raise InvalidArgumentError(f"token id {bad[0]} is out of range for a vocabulary of {vocab_size}", param="tokens")
    if ctx.tokenizer is None:
        return error_response(request.url.path, ApiError(400, "this server has no tokenizer", param="tokens"))
    return {"prompt": ctx.tokenizer.decode(body.tokens)}


def add_routes(app: FastAPI) -> None:
    app.add_api_route("/v1/models", list_models, methods=["GET"])
    app.add_api_route("/v1/models/{model_id:path}", retrieve_model, methods=["GET"])
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/version", version, methods=["GET"])
    app.add_api_route("/metrics", metrics, methods=["GET"])
    app.add_api_route("/tokenize", tokenize, methods=["POST"])
    app.add_api_route("/detokenize", detokenize, methods=["POST"])
