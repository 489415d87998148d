"""What operators add around the API server: TLS, CORS, JSON logs with
request ids, OpenTelemetry traces. ``octavo serve`` adds the flags
(``add_operations_args``), checks them before the engine starts
(``operations_from``), installs them on the app ``build_app`` made
(``install_operations``) and passes ``uvicorn_options`` to uvicorn.

Middleware order, outermost first: request id (every response carries
``X-Request-Id``; every log line of the request its id), CORS (only when
``--allowed-origins`` is given: a browser's preflight is answered before
authentication), then ``build_app``'s own stack.
"""

from __future__ import annotations

import argparse
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from octavo.entrypoints.logging_setup import CLIENT_REQUEST_ID, LOG_FORMATS, REQUEST_ID
from octavo.errors import InvalidArgumentError

# A client's X-Request-Id is logged (as client_request_id) only if it looks like an id.
_CLIENT_ID = re.compile(r"^[\w.:-]{1,128}$")


@dataclass
class OperationsConfig:
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    # Mutual TLS: the CAs that sign client certificates, and whether one is
    # required (ssl.CERT_NONE 0, CERT_OPTIONAL 1, CERT_REQUIRED 2; vLLM's).
    ssl_ca_certs: str | None = None
    ssl_cert_reqs: int = 0
    allowed_origins: list[str] = field(default_factory=list)  # empty: CORS off
    allowed_methods: list[str] = field(default_factory=lambda: ["*"])
    allowed_headers: list[str] = field(default_factory=lambda: ["*"])
    allow_credentials: bool = False
    log_format: str = "text"
    otlp_traces_endpoint: str | None = None


def add_operations_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("operations")
    group.add_argument("--ssl-keyfile", default=None, help="serve HTTPS with this private key (PEM)")
    group.add_argument("--ssl-certfile", default=None, help="and this certificate chain (PEM)")
    group.add_argument("--ssl-ca-certs", default=None, help="mutual TLS: the CA certificates (PEM) client certificates must chain to")
    group.add_argument(
        "--ssl-cert-reqs", type=int, default=0, choices=[0, 1, 2],
        help="client certificates: 0 not asked for, 1 checked if sent, 2 required (needs --ssl-ca-certs)",
    )
    group.add_argument(
        "--enable-request-id-headers", action="store_true",
        help="accepted for vLLM's command lines: every response carries X-Request-Id",
    )
    group.add_argument("--allowed-origins", nargs="+", default=[], help="CORS: origins browsers may call from ('*': any); default: CORS off")
    group.add_argument("--allowed-methods", nargs="+", default=["*"], help="CORS: allowed methods (default: any)")
    group.add_argument("--allowed-headers", nargs="+", default=["*"], help="CORS: allowed request headers (default: any)")
    group.add_argument("--allow-credentials", action="store_true", help="CORS: allow cookies and Authorization")
    group.add_argument("--log-format", default="text", choices=LOG_FORMATS, help="json: one object a line, with request ids")
    group.add_argument("--otlp-traces-endpoint", default=None, help="export request traces over OTLP/HTTP to this URL (e.g. http://127.0.0.1:4318)")


def operations_from(args: argparse.Namespace) -> OperationsConfig:
    """The options, checked (files exist, both TLS halves given) before any work starts."""
    if (args.ssl_keyfile is None) != (args.ssl_certfile is None):
        raise InvalidArgumentError("--ssl-keyfile and --ssl-certfile go together", param="ssl_keyfile")
    for name in ("ssl_keyfile", "ssl_certfile", "ssl_ca_certs"):
        path = getattr(args, name)
        if path is not None and not Path(path).is_file():
            raise InvalidArgumentError(f"--{name.replace('_', '-')} {path}: no such file", param=name)
    if (args.ssl_ca_certs is not None or args.ssl_cert_reqs) and args.ssl_certfile is None:
        raise InvalidArgumentError("--ssl-ca-certs and --ssl-cert-reqs need --ssl-keyfile and --ssl-certfile", param="ssl_ca_certs")
    if args.ssl_cert_reqs and args.ssl_ca_certs is None:
        raise InvalidArgumentError("--ssl-cert-reqs needs --ssl-ca-certs to check client certificates", param="ssl_cert_reqs")
    return OperationsConfig(
        ssl_keyfile=args.ssl_keyfile,
        ssl_certfile=args.ssl_certfile,
        ssl_ca_certs=args.ssl_ca_certs,
        ssl_cert_reqs=args.ssl_cert_reqs,
        allowed_origins=list(args.allowed_origins),
        allowed_methods=list(args.allowed_methods),
        allowed_headers=list(args.allowed_headers),
        allow_credentials=args.allow_credentials,
        log_format=args.log_format,
        otlp_traces_endpoint=args.otlp_traces_endpoint,
    )


def install_operations(app, config: OperationsConfig) -> None:
    """CORS, request ids and tracing on an app ``build_app`` made (before it starts)."""
    if config.otlp_traces_endpoint:
        from octavo.entrypoints.tracing import RequestTracer

        tracer = RequestTracer(config.otlp_traces_endpoint)
        engine = app.state.octavo.engine
        engine.observer = ObserverGroup([engine.observer, tracer])
        app.state.tracer = tracer
    if config.allowed_origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware,
            allow_origins=config.allowed_origins,
            allow_methods=config.allowed_methods,
            allow_headers=config.allowed_headers,
            allow_credentials=config.allow_credentials,
            expose_headers=["X-Request-Id"],
        )
    app.add_middleware(RequestIdMiddleware)


def uvicorn_options(config: OperationsConfig) -> dict[str, Any]:
    options: dict[str, Any] = {"ssl_keyfile": config.ssl_keyfile, "ssl_certfile": config.ssl_certfile}
    if config.ssl_ca_certs is not None:
        options.update(ssl_ca_certs=config.ssl_ca_certs, ssl_cert_reqs=config.ssl_cert_reqs)
    if config.log_format == "json":
        options["log_config"] = None  # uvicorn's loggers then reach the JSON handler on the root
    return options


class ObserverGroup:
    """Several ``EngineObserver``s as one (metrics and tracing)."""

    def __init__(self, observers: list) -> None:
        self.observers = [o for o in observers if o is not None]

    def on_request_added(self, request_id, num_prompt_tokens, params) -> None:
        for observer in self.observers:
            observer.on_request_added(request_id, num_prompt_tokens, params)

    def on_outputs(self, outputs) -> None:
        for observer in self.observers:
            observer.on_outputs(outputs)

    def on_request_aborted(self, request_id) -> None:
        for observer in self.observers:
            observer.on_request_aborted(request_id)


class RequestIdMiddleware:
    """Gives each HTTP request an id: in the log lines logged while it is
    handled, in the ``X-Request-Id`` response header, and in the engine's
    request id (``cmpl-<id>``, ``chatcmpl-<id>``, ``msg_<id>``)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = uuid.uuid4().hex
        client_id = _client_request_id(scope)
        tokens = REQUEST_ID.set(request_id), CLIENT_REQUEST_ID.set(client_id)

        async def send_with_id(message) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            REQUEST_ID.reset(tokens[0])
            CLIENT_REQUEST_ID.reset(tokens[1])


def _client_request_id(scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"x-request-id":
            text = value.decode("latin-1")
            return text if _CLIENT_ID.match(text) else None
    return None
