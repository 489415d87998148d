"""The served OpenAPI document (``GET /openapi.json``, behind the API key like
every route but the public ones).

The generation routes parse their bodies themselves (``serving.parse_body``:
pydantic's JSON parser, errors in each API's own shape), so FastAPI never
sees their request models. ``add_json_route`` declares a route's request
model, its response model (the 200 answer; ``text/event-stream`` too where
the route streams) and its error answers, and ``install_openapi`` builds the
document from them: FastAPI's own, plus the request models' schemas, the
bearer scheme, and the served model names as the only values of ``model``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from octavo.entrypoints.openai.responses import AnthropicErrorResponse, OpenAIErrorResponse

REF = "#/components/schemas/{model}"
ERROR_STATUSES = {
    400: "invalid request: bad JSON, a field of the wrong type or out of range, a prompt that does not fit",
    401: "missing or wrong API key",
    404: "unknown model, or unknown stored response",
    409: "the prefix cache is in use by running requests (POST /reset_prefix_cache)",
    413: "request body too large, or a request that can never fit in the KV cache",
    431: "request headers too large",
    500: "a bug (never bad input): the engine failed this request",
    503: "the server is at capacity, its engine failed, or it is shutting down",
}
# Before OpenAPI 3.2 (``itemSchema``) a text/event-stream ``schema`` describes one event, as
# tools read it (schemathesis checks each event against it): an object of SSE fields whose
# ``data`` is one JSON chunk of the route's stream, or "[DONE]".
SSE = {"text/event-stream": {"schema": {
    "type": "object",
    "description": "one server-sent event: its data is a JSON chunk of the stream, or [DONE] at the end",
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"},
                   "retry": {"type": "integer"}},
    "required": ["data"],
}}}


def error_responses(anthropic: bool = False, statuses: Sequence[int] = tuple(ERROR_STATUSES)) -> dict:
    model = AnthropicErrorResponse if anthropic else OpenAIErrorResponse
    return {status: {"model": model, "description": ERROR_STATUSES[status]} for status in statuses}


def add_json_route(
    app: FastAPI,
    path: str,
    endpoint: Callable,
    *,
    body: type[BaseModel] | None,
    response: type[BaseModel] | None,
    methods: Sequence[str] = ("POST",),
    streams: bool = False,
    anthropic: bool = False,
    statuses: Sequence[int] = tuple(ERROR_STATUSES),
) -> None:
    responses: dict[int | str, Any] = error_responses(anthropic, statuses)
    if streams:
        responses[200] = {"content": SSE, "description": "the answer, or with stream=true its events"}
    extra = None
    if body is not None:
        app.state.octavo_body_models.append(body)
        schema = {"$ref": REF.format(model=body.__name__)}
        extra = {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}
    app.add_api_route(
        path, endpoint, methods=list(methods), response_model=response, responses=responses, openapi_extra=extra
    )


def install_openapi(app: FastAPI, served_model_names: list[str] | None, public_paths: frozenset[str]) -> None:
    """Serve the document at ``/openapi.json`` (built once, on first request)."""

    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = _build(app, served_model_names, public_paths)
        return app.openapi_schema

    app.openapi = openapi


def _build(app: FastAPI, served_model_names: list[str] | None, public_paths: frozenset[str]) -> dict:
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    _, defs = models_json_schema([(m, "validation") for m in app.state.octavo_body_models], ref_template=REF)
    schemas.update(defs.get("$defs", {}))
    for name in {m.__name__ for m in app.state.octavo_body_models}:
        model_field = schemas[name].get("properties", {}).get("model")
        if model_field is not None and served_model_names is not None:  # None: any name (they change)
            _restrict_to(model_field, served_model_names)
    components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    schema["security"] = [{"bearer": []}]
    for path, operations in schema.get("paths", {}).items():
        if path in public_paths:
            for operation in operations.values():
                operation["security"] = []
    return schema


def _restrict_to(field_schema: dict, names: list[str]) -> None:
    """``model`` is one of the served names (or null, where the field is optional)."""
    for option in field_schema.get("anyOf", [field_schema]):
        if option.get("type") == "string":
            option["enum"] = list(names)
