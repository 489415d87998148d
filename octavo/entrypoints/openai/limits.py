"""Request-size limits and the drain gate, as ASGI middleware.

``GateMiddleware`` (outermost) refuses oversized headers with 431 and, once
the server is draining for shutdown, every new request with 503.
``BodyLimitMiddleware`` (inside authentication, so that anonymous clients
cannot make the server buffer anything) refuses bodies over the cap with 413,
from ``Content-Length`` when there is one and by counting otherwise; it
buffers the (bounded) body and replays it to the app, then passes the
original ``receive`` through so that client disconnects are still seen.
"""

from __future__ import annotations

from collections.abc import Callable

from octavo.entrypoints.openai.errors import ApiError, error_response

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


async def _send_error(scope, receive, send, error: ApiError) -> None:
    await error_response(scope.get("path", ""), error)(scope, receive, send)


class GateMiddleware:
    def __init__(self, app, max_header_bytes: int, is_draining: Callable[[], bool]) -> None:
        self.app = app
        self.max_header_bytes = max_header_bytes
        self.is_draining = is_draining

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header_bytes = sum(len(name) + len(value) + 4 for name, value in scope.get("headers", []))
        if header_bytes > self.max_header_bytes:
            message = f"the request headers are {header_bytes} bytes; the limit is {self.max_header_bytes}"
            await _send_error(scope, receive, send, ApiError(431, message, code="request_header_fields_too_large"))
            return
        if self.is_draining():
            error = ApiError(503, "the server is shutting down", "server_shutting_down", code="server_shutting_down")
            await _send_error(scope, receive, send, error)
            return
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    def __init__(self, app, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope.get("method") not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                await _send_error(scope, receive, send, ApiError(400, "invalid Content-Length header", code="invalid_content_length"))
                return
            if int(declared) > self.max_body_bytes:
                await _send_error(scope, receive, send, self._too_large(int(declared)))
                return
        chunks: list[bytes] = []
        num_bytes = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            num_bytes += len(chunk)
            if num_bytes > self.max_body_bytes:
                await _send_error(scope, receive, send, self._too_large(num_bytes))
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    def _too_large(self, num_bytes: int) -> ApiError:
        message = f"the request body is at least {num_bytes} bytes; the limit is {self.max_body_bytes}"
        return ApiError(413, message, code="request_too_large")


def _replay(body: bytes, receive):
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
