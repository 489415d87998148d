"""API-key authentication as ASGI middleware, deny by default.

Every HTTP path needs the key except those in an explicit allowlist
(``PUBLIC_PATHS``): a route added later is protected without anyone having to
remember it, and so is a path that matches no route (no route probing).
Keys are compared in constant time. Clients send ``Authorization: Bearer
<key>``; on the Anthropic routes ``x-api-key: <key>`` works too (that is what
the ``anthropic`` client sends).
"""

from __future__ import annotations

import hmac

from octavo.entrypoints.openai.config import PUBLIC_PATHS
from octavo.entrypoints.openai.errors import ApiError, error_response, is_anthropic_path


def presented_key(headers: list[tuple[bytes, bytes]], path: str) -> bytes | None:
    bearer = None
    api_key_header = None
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() == b"bearer":
                bearer = token.strip()
        elif name == b"x-api-key":
            api_key_header = value.strip()
    if bearer is not None:
        return bearer
    return api_key_header if is_anthropic_path(path) else None


def route_path(scope) -> str:
    """The request's path without the server's root path (``--root-path``), as routes see it."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("", "/"):
        return path[len(root) :] or "/"
    return path


class AuthMiddleware:
    def __init__(self, app, api_key: str, public_paths: frozenset[str] = PUBLIC_PATHS) -> None:
        self.app = app
        self._key = api_key.encode()
        self.public_paths = public_paths

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        path = route_path(scope)
        if scope["type"] == "http" and path in self.public_paths:
            await self.app(scope, receive, send)
            return
        key = presented_key(scope.get("headers", []), path)
        # compare_digest on both branches keeps the timing independent of the key.
        valid = hmac.compare_digest(key or b"", self._key) and key is not None
        if valid:
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            await send({"type": "websocket.close", "code": 1008})
            return
        error = ApiError(
            401,
            "invalid or missing API key: send it as `Authorization: Bearer <key>`",
            "invalid_request_error",
            code="invalid_api_key",
        )
        response = error_response(path, error, headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)
