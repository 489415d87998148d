"""``POST /classify`` (vLLM's body and response): each input's scores over
the classifier's labels (after the model's activation: softmax, or sigmoid
for one label), and the best label's name."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from octavo.core.pooling_params import PoolingParams, check_pooling_params
from octavo.entrypoints.openai.openapi import add_json_route
from octavo.entrypoints.openai.pooling_protocol import ClassifyRequest, ClassifyResponse
from octavo.entrypoints.openai.pooling_serving import parse_inputs, run_pooling, usage
from octavo.entrypoints.openai.serving import get_context, new_request_id, parse_body, resolve_model, unix_time


async def create_classification(request: Request):
    ctx = get_context(request)
    body = await parse_body(request, ClassifyRequest)
    model = resolve_model(ctx, body.model)
    params = PoolingParams(task="classify")
    check_pooling_params(params, ctx.limits.pooler)  # the task, before any tokenizing
    inputs = await parse_inputs(ctx, body.input, body.truncate_prompt_tokens)
    request_id = new_request_id("classify")
    outputs = await run_pooling(request, ctx, request_id, inputs, params)
    labels = ctx.limits.pooler.labels
    data = []
    for i, output in enumerate(outputs):
        probs = output.outputs.probs
        best = max(range(len(probs)), key=probs.__getitem__)
        data.append({"index": i, "label": labels[best], "probs": probs, "num_classes": len(probs)})
    return JSONResponse(
        {"id": request_id, "object": "list", "created": unix_time(), "model": model, "data": data, "usage": usage(inputs)}
    )


def add_routes(app: FastAPI) -> None:
    add_json_route(app, "/classify", create_classification, body=ClassifyRequest, response=ClassifyResponse)
