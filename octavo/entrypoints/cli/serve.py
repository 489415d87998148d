"""``octavo serve [MODEL]``: the OpenAI- and Anthropic-compatible HTTP server.

Shutdown on SIGTERM: new requests get 503 and the listening socket closes;
requests in flight may finish for ``--shutdown-timeout`` seconds; then the
rest are aborted (their clients get an error), the engine stops and the
process exits with status 0.

Connections go through ``GuardedH11Protocol`` (header and body deadlines,
the connection cap, 431 for oversized heads); the messages a client can
make the server repeat are rate-limited in the log.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal

from octavo.entrypoints.openai.config import DEFAULT_HOST, DEFAULT_PORT, ServerConfig

logger = logging.getLogger("octavo.serve")
API_KEY_ENV = "OCTAVO_API_KEY"
# uvicorn's own cancel-everything deadline, after ours has aborted the requests.
UVICORN_GRACE_SECONDS = 5.0
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def add_parser(sub) -> None:
    from octavo.entrypoints.cli.common import add_engine_args, json_object
    from octavo.entrypoints.openai.operations import add_operations_args

    defaults = ServerConfig()
    parser = sub.add_parser("serve", help="serve a model over HTTP (OpenAI and Anthropic APIs)")
    add_engine_args(parser, model_positional=True)
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    parser.add_argument("--api-key", default=None, help=f"require this key on every route but /health, /ping, /version and the web UI's pages (also ${API_KEY_ENV})")
    parser.add_argument("--served-model-name", nargs="+", default=None, help="name(s) clients use for the model (default: the model path)")
    parser.add_argument("--max-queued-requests", type=int, default=defaults.max_queued_requests, help="sequences allowed to wait beyond --max-num-seqs; past it, 503")
    parser.add_argument("--shutdown-timeout", type=float, default=defaults.shutdown_timeout, help="seconds to drain on SIGTERM before aborting")
    parser.add_argument("--max-request-body-bytes", type=int, default=defaults.max_request_body_bytes)
    parser.add_argument("--max-request-header-bytes", type=int, default=defaults.max_request_header_bytes)
    parser.add_argument("--max-n", type=int, default=defaults.max_n, help="the largest n a request may ask for")
    parser.add_argument("--max-stop-sequences", type=int, default=defaults.max_stop_sequences)
    parser.add_argument("--max-stop-sequence-chars", type=int, default=defaults.max_stop_sequence_chars, help="the longest stop string")
    parser.add_argument("--max-logprobs", type=int, default=20, help="the largest logprobs/top_logprobs a request may ask for")
    parser.add_argument("--max-prompt-chars", type=int, default=None, help="the longest prompt text tokenised (default: the longest that could fit the context)")
    parser.add_argument("--tokenizer-pool-size", type=int, default=None, help="threads that tokenise and render chat templates (default: min(4, CPUs))")
    parser.add_argument("--header-read-timeout", type=float, default=defaults.header_read_timeout, help="seconds for a request's headers to arrive, from connect or its first byte; then 408 or close")
    parser.add_argument("--body-read-timeout", type=float, default=defaults.body_read_timeout, help="seconds for a request's body to arrive after its headers; then 408")
    parser.add_argument("--keep-alive-timeout", type=float, default=defaults.keep_alive_timeout, help="seconds an idle kept-alive connection stays open")
    parser.add_argument("--max-connections", type=int, default=defaults.max_connections, help="connections open at once; beyond it the oldest idle one is closed, or 503 if none is idle")
    parser.add_argument("--restart-engine", action="store_true", help="rebuild the engine if it fails (counted in octavo:engine_restarts_total)")
    parser.add_argument("--tool-call-parser", default=None, help="how tool calls are read from the output: hermes (or qwen), llama3_json, mistral, granite, phi4_mini_json, pythonic (or llama4_pythonic), deepseek_v3 (or deepseek_v31), qwen3_coder, seed_oss, olmo3, kimi_k2, glm45, openai (gpt-oss)")
    parser.add_argument("--enable-auto-tool-choice", action="store_true", help="let the model decide to call tools (tool_choice 'auto'); needs --tool-call-parser")
    parser.add_argument("--reasoning-parser", default=None, help="split reasoning from the answer: qwen3, deepseek_r1, deepseek_v3 (V3.1: by the thinking template variable), mistral, granite, seed_oss, olmo3, glm45, openai_gptoss (gpt-oss)")
    parser.add_argument("--default-chat-template-kwargs", type=json_object, default=None, help="chat template variables for every request, as JSON (e.g. '{\"enable_thinking\": false}'); a request's chat_template_kwargs win")
    parser.add_argument("--enable-force-include-usage", action="store_true", help="end every stream with a usage chunk, asked for or not")
    parser.add_argument("--enable-log-requests", action="store_true", help="log each request's prompt and parameters (prompts are your users' data)")
    parser.add_argument("--max-log-len", type=int, default=None, help="with --enable-log-requests: the characters and token ids of a prompt logged")
    parser.add_argument(
        "--lora-modules", nargs="+", default=None, metavar="NAME=PATH",
        help="LoRA adapters served as models of their own (needs --enable-lora): name=path or a JSON object "
        '{"name": ..., "path": ...}',
    )
    parser.add_argument(
        "--allow-runtime-lora-updating", action="store_true",
        default=os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true"),
        help="POST /v1/load_lora_adapter and /v1/unload_lora_adapter (needs --enable-lora; one API process); "
        "also on with VLLM_ALLOW_RUNTIME_LORA_UPDATING=true",
    )
    parser.add_argument("--enable-prompt-tokens-details", action="store_true", help="accepted for vLLM's command lines: usage.prompt_tokens_details is always sent")
    parser.add_argument("--max-stored-responses", type=int, default=defaults.max_stored_responses, help="Responses API answers kept in memory for previous_response_id and GET /v1/responses/{id} (0: none)")
    parser.add_argument("--max-stored-response-bytes", type=int, default=defaults.max_stored_response_bytes, help="their total JSON size; the least recently used go first")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--disable-uvicorn-access-log", action="store_true")
    parser.add_argument(
        "--return-tokens-as-token-ids", action="store_true",
        help="logprob tokens written as token_id:N (requests may still choose with return_tokens_as_token_ids)",
    )
    parser.add_argument(
        "--disable-log-stats", action="store_true",
        help="no periodic stats line (throughput, requests, KV usage; every VLLM_LOG_STATS_INTERVAL seconds, default 10)",
    )
    parser.add_argument(
        "--uvicorn-log-level", default=None, choices=["critical", "error", "warning", "info", "debug", "trace"],
        help="uvicorn's own log level (default: --log-level)",
    )
    parser.add_argument(
        "--root-path", default="",
        help="the path prefix a proxy serves this server under; requests may carry it or not",
    )
    parser.add_argument("--no-ui", dest="enable_ui", action="store_false", help="leave out the web playground (/) and dashboard (/dashboard)")
    add_operations_args(parser)  # TLS, CORS, JSON logs, traces (openai/operations.py)
    parser.add_argument(
        "--api-server-count", type=int, default=1,
        help="API processes in front of the engine process(es), sharing the port (docs/serving.md: sizing)",
    )
    # The engine's steps would otherwise share the interpreter lock with the
    # HTTP event loop: at 256 streams on the H200 that starved the loop
    # (TTFT p50 3.8 s against 0.37 s, and one connection dropped;
    # benchmarks/RESULTS.md, round 19).
    parser.set_defaults(func=run, engine_process=True)


def server_config_from(args: argparse.Namespace) -> ServerConfig:
    from octavo.default_model import DEFAULT_MODEL_NAME
    from octavo.errors import InvalidArgumentError

    for name in ("max_queued_requests", "shutdown_timeout", "max_stored_responses", "max_stored_response_bytes"):
        if getattr(args, name) < 0:
            raise InvalidArgumentError(f"--{name.replace('_', '-')} must not be negative", param=name)
    for name in ("max_request_body_bytes", "max_request_header_bytes", "max_n", "max_stop_sequences",
                 "max_stop_sequence_chars", "max_connections"):
        if getattr(args, name) < 1:
            raise InvalidArgumentError(f"--{name.replace('_', '-')} must be at least 1", param=name)
    for name in ("max_prompt_chars", "tokenizer_pool_size"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise InvalidArgumentError(f"--{name.replace('_', '-')} must be at least 1", param=name)
    for name in ("header_read_timeout", "body_read_timeout", "keep_alive_timeout"):
        if not getattr(args, name) > 0:
            raise InvalidArgumentError(f"--{name.replace('_', '-')} must be positive", param=name)
    if args.api_server_count < 1:
        raise InvalidArgumentError("--api-server-count must be at least 1", param="api_server_count")
    if args.allow_runtime_lora_updating and (not args.enable_lora or args.api_server_count > 1):
        raise InvalidArgumentError(
            "--allow-runtime-lora-updating needs --enable-lora and one API process (each would keep its own adapters)",
            param="allow_runtime_lora_updating",
        )
    if args.root_path and not args.root_path.startswith("/"):
        raise InvalidArgumentError(f"--root-path must start with '/', got {args.root_path!r}", param="root_path")
    if not 0 <= args.port <= 65535:
        raise InvalidArgumentError(f"--port must be in 0..65535, got {args.port}", param="port")
    from octavo.entrypoints.openai.chat_features import check_parser_names
    from octavo.entrypoints.openai.conversation import template_kwargs

    check_parser_names(args.tool_call_parser, args.reasoning_parser)
    if args.enable_auto_tool_choice and args.tool_call_parser is None:
        raise InvalidArgumentError("--enable-auto-tool-choice needs --tool-call-parser", param="tool_call_parser")
    return ServerConfig(
        served_model_names=args.served_model_name or [args.model or DEFAULT_MODEL_NAME],
        model_root=args.model or DEFAULT_MODEL_NAME,
        api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
        max_queued_requests=args.max_queued_requests,
        shutdown_timeout=args.shutdown_timeout,
        max_request_body_bytes=args.max_request_body_bytes,
        max_request_header_bytes=args.max_request_header_bytes,
        max_n=args.max_n,
        max_stop_sequences=args.max_stop_sequences,
        enable_ui=args.enable_ui,
        root_path=args.root_path.rstrip("/"),
        log_stats_interval_s=0.0 if args.disable_log_stats else _log_stats_interval(),
        return_tokens_as_token_ids=args.return_tokens_as_token_ids,
        max_stop_sequence_chars=args.max_stop_sequence_chars,
        max_prompt_chars=args.max_prompt_chars,
        tokenizer_pool_size=args.tokenizer_pool_size,
        header_read_timeout=args.header_read_timeout,
        body_read_timeout=args.body_read_timeout,
        keep_alive_timeout=args.keep_alive_timeout,
        max_connections=args.max_connections,
        tool_call_parser=args.tool_call_parser,
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        reasoning_parser=args.reasoning_parser,
        max_stored_responses=args.max_stored_responses,
        default_chat_template_kwargs=template_kwargs(args.default_chat_template_kwargs, "default_chat_template_kwargs"),
        enable_force_include_usage=args.enable_force_include_usage,
        enable_log_requests=args.enable_log_requests,
        max_log_len=args.max_log_len,
        max_stored_response_bytes=args.max_stored_response_bytes,
        lora_modules=parse_lora_modules(args.lora_modules, args.enable_lora),
        allow_runtime_lora_updating=args.allow_runtime_lora_updating,
    )


def parse_lora_modules(specs: list[str] | None, enable_lora: bool) -> dict[str, str]:
    """vLLM's --lora-modules: ``name=path`` or ``{"name": ..., "path": ...}`` each."""
    from octavo.errors import InvalidArgumentError

    if not specs:
        return {}
    if not enable_lora:
        raise InvalidArgumentError("--lora-modules needs --enable-lora", param="lora_modules")
    modules: dict[str, str] = {}
    for spec in specs:
        if spec.lstrip().startswith("{"):
            try:
                entry = json.loads(spec)
                name, path = entry["name"], entry["path"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise InvalidArgumentError(f"--lora-modules {spec!r}: a JSON entry needs name and path", param="lora_modules") from None
        else:
            name, sep, path = spec.partition("=")
            if not sep:
                raise InvalidArgumentError(f"--lora-modules {spec!r}: expected name=path", param="lora_modules")
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path or name in modules:
            raise InvalidArgumentError(f"--lora-modules {spec!r}: a name and a path, each name once", param="lora_modules")
        modules[name] = path
    return modules


def run(args: argparse.Namespace) -> int:
    from octavo.errors import OctavoError

    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise OctavoError(f"octavo serve needs the serve extra ({exc.name} is missing): pip install 'octavo[serve]'")
    from octavo.entrypoints.engine_restart import EngineRestarter
    from octavo.entrypoints.logging_setup import configure_logging
    from octavo.entrypoints.openai.app import build_app

    configure_logging(args.log_level, args.log_format)
    config = server_config_from(args)
    if config.api_key is None and args.host not in LOOPBACK_HOSTS:
        logger.warning("serving on %s without an API key: anyone who can reach it can use it", args.host)
    if args.api_server_count > 1:
        return _run_api_servers(args)
    engine = start_engine(args)
    restarter = EngineRestarter(lambda: start_engine(args)) if args.restart_engine else None
    serve_app(build_app(engine, config, restarter), args, config)
    return 0


def _run_api_servers(args: argparse.Namespace) -> int:
    from octavo.entrypoints.cli.api_servers import run_api_servers
    from octavo.entrypoints.fault_injection import FAULT_AFTER_STEPS_ENV, FAULT_FILE_ENV
    from octavo.errors import InvalidArgumentError

    fault_hooks = any(os.environ.get(name) for name in (FAULT_FILE_ENV, FAULT_AFTER_STEPS_ENV))
    if not args.engine_process or args.restart_engine or fault_hooks:
        raise InvalidArgumentError(
            "--api-server-count above 1 needs the engine in its own process "
            "(no --no-engine-process, --restart-engine or test fault hooks)",
            param="api_server_count",
        )
    return run_api_servers(args)


def _log_stats_interval() -> float:
    """vLLM's ``VLLM_LOG_STATS_INTERVAL`` (seconds; default 10)."""
    from octavo.errors import InvalidArgumentError

    text = os.environ.get("VLLM_LOG_STATS_INTERVAL", "10")
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise InvalidArgumentError(f"VLLM_LOG_STATS_INTERVAL must be a positive number of seconds, got {text!r}")
    return value


def serve_app(app, args: argparse.Namespace, config: ServerConfig, sockets=None, on_started=None) -> None:
    """Run ``app`` under uvicorn until SIGTERM has drained it: on ``sockets``
    if given (one API process of several), else on ``--host``/``--port``;
    ``on_started`` is called once it listens."""
    import uvicorn

    from octavo.entrypoints.async_engine import ServerShuttingDownError
    from octavo.entrypoints.openai.connections import ConnectionLimits, fit_to_fd_limit, guarded_protocol
    from octavo.entrypoints.openai.log_limits import install_rate_limits
    from octavo.entrypoints.openai.operations import install_operations, operations_from, uvicorn_options

    operations = operations_from(args)
    install_operations(app, operations)
    ctx = app.state.octavo

    def begin_drain() -> None:
        ctx.draining = True
        logger.info("SIGTERM: draining for up to %.1fs", config.shutdown_timeout)
        error = ServerShuttingDownError("the server shut down before this request finished")
        ctx.engine.abort_all_after(config.shutdown_timeout, error)

    limits = ConnectionLimits(
        header_read_timeout=config.header_read_timeout,
        body_read_timeout=config.body_read_timeout,
        max_connections=fit_to_fd_limit(config.max_connections),
    )
    uvicorn_config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.uvicorn_log_level or args.log_level,
        access_log=not args.disable_uvicorn_access_log,
        timeout_graceful_shutdown=config.shutdown_timeout + UVICORN_GRACE_SECONDS,
        timeout_keep_alive=config.keep_alive_timeout,
        http=guarded_protocol(limits),
        # Let oversized headers reach the app, which answers 431 in the API's shape
        # (beyond this, the protocol answers 431 itself).
        h11_max_incomplete_event_size=config.max_request_header_bytes + (64 << 10),
        lifespan="on",
        **uvicorn_options(operations),
    )
    install_rate_limits()  # after uvicorn.Config, which configures its loggers
    make_draining_server(uvicorn_config, begin_drain, on_started).run(sockets=sockets)


def start_engine(args: argparse.Namespace):
    """Build the engine (at start, and again for each restart), with the test fault hook if asked."""
    from octavo.core.gc_heap import freeze_startup_heap
    from octavo.engine_args import build_engine
    from octavo.entrypoints.cli.common import engine_args_from
    from octavo.entrypoints.fault_injection import install_from_env

    engine = build_engine(engine_args_from(args))
    try:
        install_from_env(engine)
    except BaseException:
        engine.shutdown()
        raise
    freeze_startup_heap()  # no full collections over the startup heap while serving (gc_heap)
    return engine


def make_draining_server(config, on_sigterm, on_started=None):
    """A uvicorn server that calls ``on_sigterm`` once on SIGTERM, and
    ``on_started`` once it listens (defined here so uvicorn loads lazily)."""
    import uvicorn

    class _DrainingServer(uvicorn.Server):
        """uvicorn, plus our drain on SIGTERM, and a clean exit (status 0) after it."""

        async def startup(self, sockets=None) -> None:
            await super().startup(sockets=sockets)
            if on_started is not None and not self.should_exit:
                on_started()

        def handle_exit(self, sig, frame) -> None:
            first = not self.should_exit
            super().handle_exit(sig, frame)
            if sig == signal.SIGTERM:
                # uvicorn re-raises captured signals after shutdown (which would
                # kill the process with SIGTERM); a drained shutdown is a clean exit.
                captured = getattr(self, "_captured_signals", [])
                self._captured_signals = [s for s in captured if s != signal.SIGTERM]
                if first:
                    on_sigterm()

    return _DrainingServer(config)
