"""Amazon SageMaker's container contract, as vLLM serves it: ``GET`` / ``POST
/ping`` answers like ``/health`` (without a key, as ``/health``), and ``POST
/invocations`` runs the route the body's shape asks for:

- a generative model: ``messages`` -> chat completions, ``prompt`` ->
  completions, ``input`` -> the Responses API;
- a pooling model: ``query`` and ``documents`` -> rerank, ``text_1`` and
  ``text_2`` -> score, ``input`` -> embeddings (or classification, for a
  classifier).

The chosen route parses the body as its own, so its fields, limits and errors
are the route's; a body that matches no route is a 400.
"""

from __future__ import annotations

import json

from fastapi import FastAPI, Request

from octavo.entrypoints.openai.chat import create_chat_completion
from octavo.entrypoints.openai.classify import create_classification
from octavo.entrypoints.openai.completions import create_completion
from octavo.entrypoints.openai.embeddings import create_embeddings
from octavo.entrypoints.openai.openapi import add_json_route
from octavo.entrypoints.openai.responses import HealthResponse
from octavo.entrypoints.openai.routes import health
from octavo.entrypoints.openai.score import create_rerank, create_score
from octavo.entrypoints.openai.serving import get_context
from octavo.entrypoints.responses_api.route import create_response
from octavo.errors import InvalidArgumentError

GENERATION_ROUTES = (("messages", create_chat_completion), ("prompt", create_completion), ("input", create_response))


def invocation_route(body: object, task: str):
    """The handler a SageMaker body goes to on a model of ``task``."""
    if not isinstance(body, dict):
        raise InvalidArgumentError("the request body must be a JSON object")
    if task == "generate":
        routes = GENERATION_ROUTES
    else:
        pooled = create_classification if task == "classify" else create_embeddings
        routes = (("documents", create_rerank), ("text_1", create_score), ("input", pooled))
    for key, handler in routes:
        if key in body:
            return handler
    keys = ", ".join(key for key, _ in routes)
    raise InvalidArgumentError(f"the body matches no route of this {task} model: it needs one of {keys}")


async def invocations(request: Request):
    try:
        body = json.loads(await request.body())
    except RecursionError:
        raise InvalidArgumentError("the request body is nested too deeply") from None
    except ValueError as exc:
        raise InvalidArgumentError(f"the request body is not valid JSON: {exc}") from None
    return await invocation_route(body, get_context(request).limits.task)(request)


def add_routes(app: FastAPI) -> None:
    add_json_route(app, "/ping", health, methods=["GET", "POST"], body=None, response=HealthResponse, statuses=[503])
    # Its body and answer are the chosen route's: documented there.
    add_json_route(app, "/invocations", invocations, body=None, response=None, streams=True)
