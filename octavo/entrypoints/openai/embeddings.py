"""``POST /v1/embeddings`` (OpenAI): one vector per input.

``input`` is a text, a list of texts, a list of token ids or a list of such
lists; ``encoding_format`` is ``float`` (JSON numbers) or ``base64`` (the
float32 little-endian bytes, which the ``openai`` SDK decodes; it asks for
them by default); ``dimensions`` keeps the first values of a Matryoshka
embedding, which is then normalised again.
"""

from __future__ import annotations

import base64

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from octavo.core.outputs import PoolingOutput
from octavo.core.pooling_params import PoolingParams, check_pooling_params
from octavo.entrypoints.openai.openapi import add_json_route
from octavo.entrypoints.openai.pooling_protocol import EmbeddingRequest, EmbeddingResponse
from octavo.entrypoints.openai.pooling_serving import parse_inputs, run_pooling, usage
from octavo.entrypoints.openai.serving import get_context, new_request_id, parse_body, resolve_model, unix_time


def encode_embedding(vector: PoolingOutput, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(vector.raw).decode("ascii")  # already float32 little-endian
    return vector.embedding


async def create_embeddings(request: Request):
    ctx = get_context(request)
    body = await parse_body(request, EmbeddingRequest)
    model = resolve_model(ctx, body.model)
    params = PoolingParams(task="embed", dimensions=body.dimensions, normalize=body.normalize)
    check_pooling_params(params, ctx.limits.pooler)  # the task and dimensions, before any tokenizing
    inputs = await parse_inputs(ctx, body.input, body.truncate_prompt_tokens)
    request_id = new_request_id("embd")
    outputs = await run_pooling(request, ctx, request_id, inputs, params)
    data = [
        {"object": "embedding", "index": i, "embedding": encode_embedding(output.outputs, body.encoding_format)}
        for i, output in enumerate(outputs)
    ]
    usage_counts = usage(inputs)
    del usage_counts["completion_tokens"]
    return JSONResponse(
        {"id": request_id, "object": "list", "created": unix_time(), "model": model, "data": data, "usage": usage_counts}
    )


def add_routes(app: FastAPI) -> None:
    add_json_route(app, "/v1/embeddings", create_embeddings, body=EmbeddingRequest, response=EmbeddingResponse)
