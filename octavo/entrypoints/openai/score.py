"""Scoring text pairs: ``POST /score`` and ``/v1/score`` (vLLM's body), and
reranking documents against a query: ``POST /rerank``, ``/v1/rerank`` and
``/v2/rerank`` (Jina's and Cohere's body; Jina's response, which Cohere's
clients also read).

A one-label cross-encoder scores each pair in one pass; an embedding model
scores a pair by the cosine of the two texts' embeddings (each distinct
text embedded once). Rerank results are sorted by score, best first, and
cut to ``top_n``.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from octavo.core.pooling_params import PoolingParams
from octavo.entrypoints.openai.openapi import add_json_route
from octavo.entrypoints.openai.pooling_protocol import (
    RerankDocument,
    RerankRequest,
    RerankResponse,
    ScoreRequest,
    ScoreResponse,
)
from octavo.entrypoints.openai.pooling_serving import plan_pair_scores, run_pooling, usage
from octavo.entrypoints.openai.serving import ServingContext, get_context, new_request_id, parse_body, resolve_model, unix_time
from octavo.entrypoints.pooling_inputs import ScorePlan, check_can_score, score_pairs
from octavo.errors import InvalidArgumentError

async def _score(request: Request, ctx: ServingContext, request_id: str, plan: ScorePlan) -> list[float]:
    outputs = await run_pooling(request, ctx, request_id, plan.inputs, PoolingParams(task=plan.task))
    return plan.scores([output.outputs.data for output in outputs])


async def create_score(request: Request):
    ctx = get_context(request)
    body = await parse_body(request, ScoreRequest)
    model = resolve_model(ctx, body.model)
    check_can_score(ctx.limits.pooler)
    plan = await plan_pair_scores(ctx, score_pairs(body.text_1, body.text_2), body.truncate_prompt_tokens, "text_2")
    request_id = new_request_id("score")
    scores = await _score(request, ctx, request_id, plan)
    data = [{"index": i, "object": "score", "score": score} for i, score in enumerate(scores)]
    return JSONResponse(
        {"id": request_id, "object": "list", "created": unix_time(), "model": model, "data": data, "usage": usage(plan.inputs)}
    )


async def create_rerank(request: Request):
    ctx = get_context(request)
    body = await parse_body(request, RerankRequest)
    model = resolve_model(ctx, body.model)
    check_can_score(ctx.limits.pooler)
    if body.max_chunks_per_doc is not None:
        raise InvalidArgumentError("max_chunks_per_doc is not supported", param="max_chunks_per_doc")
    if body.top_n is not None and body.top_n < 1:
        raise InvalidArgumentError(f"top_n must be at least 1, got {body.top_n}", param="top_n")
    documents = [d.text if isinstance(d, RerankDocument) else d for d in body.documents]
    if not documents:
        raise InvalidArgumentError("documents is empty", param="documents")
    plan = await plan_pair_scores(ctx, score_pairs(body.query, documents), body.truncate_prompt_tokens, "documents")
    request_id = new_request_id("rerank")
    scores = await _score(request, ctx, request_id, plan)
    ranked = sorted(range(len(documents)), key=lambda i: scores[i], reverse=True)[: body.top_n]
    results = []
    for index in ranked:
        result = {"index": index, "relevance_score": scores[index]}
        if body.return_documents is not False:
            result["document"] = {"text": documents[index]}
        results.append(result)
    total = usage(plan.inputs)["total_tokens"]
    return JSONResponse({"id": request_id, "model": model, "usage": {"total_tokens": total}, "results": results})


def add_routes(app: FastAPI) -> None:
    for path in ("/score", "/v1/score"):
        add_json_route(app, path, create_score, body=ScoreRequest, response=ScoreResponse)
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        add_json_route(app, path, create_rerank, body=RerankRequest, response=RerankResponse)
