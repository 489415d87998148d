"""Routes for the other kind of model answer 400 at once, as ASGI middleware.

A server runs one model, which either generates text or pools (embeddings,
classification). A generation route (completions, chat, messages, responses) on a
pooling model, or a pooling route on a generative one, gets a 400 with code
``unsupported_task`` in the route's API shape, before its body is read: the
client learns what is wrong, not whatever the route would have tripped over
first (a missing chat template, say). It sits inside authentication, so
anonymous clients learn nothing about the model.
"""

from __future__ import annotations

from collections.abc import Callable

from octavo.entrypoints.openai.errors import ApiError, error_response

GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/messages", "/v1/responses"})
POOLING_PATHS = frozenset({"/v1/embeddings", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank", "/classify"})


def refusal(path: str, task: str) -> str | None:
    """Why ``path`` cannot serve a model whose task is ``task``, or None."""
    if path in GENERATION_PATHS and task != "generate":
        return f"this model serves {task!r} requests; it does not generate text ({path} needs a generative model)"
    if path in POOLING_PATHS and task == "generate":
        return f"this model generates text; {path} needs an embedding model or a cross-encoder / classifier"
    return None


class TaskGateMiddleware:
    def __init__(self, app, task: Callable[[], str]) -> None:
        self.app = app
        self.task = task

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            path = scope.get("path", "")
            message = refusal(path, self.task())
            if message is not None:
                error = ApiError(400, message, param="model", code="unsupported_task")
                await error_response(path, error)(scope, receive, send)
                return
        await self.app(scope, receive, send)
