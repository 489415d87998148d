"""Error bodies in each API's shape, and the handlers that produce them.

Every error a client can cause leaves as a 4xx (or a 503 when the server
cannot take work) with the API's error object: OpenAI's
``{"error": {"message", "type", "param", "code"}}`` everywhere except the
Anthropic routes, which get ``{"type": "error", "error": {"type", "message"}}``.
Only genuine bugs become 500s.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from octavo.errors import InvalidArgumentError, OctavoError

logger = logging.getLogger(__name__)

ANTHROPIC_PATH_PREFIX = "/v1/messages"
# Anthropic names its error types after the status.
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


class InvalidRequestBodyError(InvalidArgumentError):
    """The body is not JSON, or does not match the endpoint's schema."""


@dataclass
class ApiError:
    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None


def error_code(exc: OctavoError) -> str:
    """``PromptTooLongError`` -> ``prompt_too_long``: stable, and says what went wrong."""
    name = type(exc).__name__.removesuffix("Error")
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def from_octavo(exc: OctavoError) -> ApiError:
    return ApiError(exc.http_status, exc.message, exc.error_type, exc.param, error_code(exc))


def openai_body(error: ApiError) -> dict:
    return {"error": {"message": error.message, "type": error.type, "param": error.param, "code": error.code}}


def anthropic_body(error: ApiError) -> dict:
    error_type = ANTHROPIC_ERROR_TYPES.get(error.status, "invalid_request_error" if error.status < 500 else "api_error")
    return {"type": "error", "error": {"type": error_type, "message": error.message}}


def is_anthropic_path(path: str) -> bool:
    return path == ANTHROPIC_PATH_PREFIX or path.startswith(ANTHROPIC_PATH_PREFIX + "/")


def error_body(path: str, error: ApiError) -> dict:
    return anthropic_body(error) if is_anthropic_path(path) else openai_body(error)


def error_response(path: str, error: ApiError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(path, error), status_code=error.status, headers=headers)


def install_exception_handlers(app: FastAPI) -> None:
    async def octavo_error(request: Request, exc: OctavoError):
        _record_failure(request, exc)
        return error_response(request.url.path, from_octavo(exc))

    async def validation_error(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(part) for part in first.get("loc", ())[1:]) or None
        message = f"{param}: {first.get('msg')}" if param else str(first.get("msg", "invalid request"))
        return error_response(request.url.path, ApiError(400, message, param=param, code="invalid_request_body"))

    async def http_error(request: Request, exc: StarletteHTTPException):
        error_type = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        error = ApiError(exc.status_code, str(exc.detail), error_type, code=_http_code(exc.status_code))
        return error_response(request.url.path, error, headers=getattr(exc, "headers", None))

    async def internal_error(request: Request, exc: Exception):
        _record_failure(request, exc)
        error = ApiError(500, f"internal server error: {type(exc).__name__}", "internal_error", code="internal_error")
        return error_response(request.url.path, error)

    app.add_exception_handler(OctavoError, octavo_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, internal_error)


def _record_failure(request: Request, exc: BaseException) -> None:
    """Count and log a 5xx the server caused (``failures.py``); the id is the HTTP request's."""
    from octavo.entrypoints.failures import record_failure
    from octavo.entrypoints.logging_setup import current_request_id

    ctx = getattr(request.app.state, "octavo", None)
    if ctx is not None:
        record_failure(ctx.metrics, current_request_id() or request.url.path, exc)
    elif not isinstance(exc, OctavoError):
        logger.exception("unhandled error on %s", request.url.path)


def _http_code(status: int) -> str:
    return {404: "not_found", 405: "method_not_allowed"}.get(status, f"http_{status}")
