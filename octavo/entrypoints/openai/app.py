"""The app factory: one engine (an ``LLMEngine``, or a ``DataParallelEngine``
over several replicas), one FastAPI app with the OpenAI (chat, completions, responses) and Anthropic routes.

Middleware, outermost first: the gate (431 for oversized headers, 503 while
draining), authentication (deny by default: ``/openapi.json`` needs the key
too), the body-size limit (413), the task gate (400 for a generation route
on a pooling model and vice versa). The engine thread starts and stops with
the app's lifespan, and so does the tokenizer pool. Each app has its own
metrics registry, so tests can build several apps in one process.
Connection-level limits (timeouts, the connection cap) are the HTTP
protocol's, set up by ``octavo serve`` (``connections.py``).
"""

from __future__ import annotations

import asyncio
import copy
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import FastAPI

from octavo.core.engine import LLMEngine
from octavo.core.lora_request import LoRARequest
from octavo.entrypoints.anthropic import messages
from octavo.entrypoints.async_engine import AsyncEngine, AsyncEngineConfig
from octavo.entrypoints.engine_restart import EngineRestarter
from octavo.entrypoints.engine_stats import engine_capacity
from octavo.entrypoints.metrics import ServerMetrics
from octavo.entrypoints.openai import chat, classify, completions, embeddings, lora_routes, routes, sagemaker, score
from octavo.entrypoints.openai.auth import AuthMiddleware
from octavo.entrypoints.openai.config import PUBLIC_PATHS, ServerConfig
from octavo.entrypoints.openai.errors import install_exception_handlers
from octavo.entrypoints.openai.limits import BodyLimitMiddleware, GateMiddleware
from octavo.entrypoints.openai.openapi import install_openapi
from octavo.entrypoints.openai.prompts import PromptLimits, default_max_prompt_chars
from octavo.entrypoints.openai.serving import ServingContext
from octavo.entrypoints.openai.task_gate import TaskGateMiddleware
from octavo.entrypoints.responses_api import route as responses_route
from octavo.entrypoints.stats_log import log_stats_periodically
from octavo.entrypoints.responses_api.background import BackgroundRuns
from octavo.entrypoints.responses_api.store import ResponseStore
from octavo.entrypoints.openai.tokenizer_pool import TokenizerPool, default_pool_size
from octavo.entrypoints.ui import add_ui_routes
from octavo.errors import InvalidArgumentError
from octavo.version import __version__

if TYPE_CHECKING:
    from octavo.distributed.data_parallel import DataParallelEngine


def build_app(
    engine: LLMEngine | DataParallelEngine,
    config: ServerConfig,
    restarter: EngineRestarter | None = None,
    api_server_index: int | None = None,
) -> FastAPI:
    """The app; with ``restarter``, a failed engine is rebuilt (``--restart-engine``);
    ``api_server_index``: this app is one of several API processes (shared metrics)."""
    capacity = engine_capacity(engine)
    metrics = ServerMetrics(capacity.num_replicas, api_server_index)
    metrics.kv_total_blocks.set(capacity.num_kv_blocks)
    metrics.max_loras = engine.limits.max_loras
    max_inflight_seqs = None
    if config.max_queued_requests is not None:
        max_inflight_seqs = capacity.max_num_seqs + config.max_queued_requests
    async_engine = AsyncEngine(
        engine, AsyncEngineConfig(max_inflight_seqs=max_inflight_seqs), observer=metrics, restarter=restarter
    )
    tokenizer = engine.tokenizer
    max_prompt_chars = config.max_prompt_chars
    if max_prompt_chars is None and tokenizer is not None:
        max_prompt_chars = default_max_prompt_chars(tokenizer, engine.limits.max_model_len)
    ctx = ServingContext(
        engine=async_engine,
        config=config,
        tokenizer=copy.deepcopy(tokenizer) if tokenizer is not None else None,
        limits=engine.limits,
        metrics=metrics,
        pool=TokenizerPool(tokenizer, config.tokenizer_pool_size or default_pool_size()),
        prompt_limits=PromptLimits(engine.limits.max_model_len, max_prompt_chars),
        lora_requests=_checked_adapters(engine, config),
        next_lora_id=len(config.lora_modules) + 1,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async_engine.start()
        stats_task = None
        if config.log_stats_interval_s > 0:
            label = "Engine 000" if api_server_index is None else f"API server {api_server_index}"
            stats_task = asyncio.create_task(log_stats_periodically(ctx, config.log_stats_interval_s, label))
        yield
        if stats_task is not None:
            stats_task.cancel()
        await app.state.octavo_background.shutdown()
        await async_engine.shutdown()
        ctx.pool.shutdown()

    app = FastAPI(
        title="Octavo", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
        description="OpenAI- and Anthropic-compatible inference server", root_path=config.root_path,
    )
    app.state.octavo = ctx
    app.state.octavo_body_models = []
    app.state.octavo_responses = _response_store(config, api_server_index)
    app.state.octavo_background = BackgroundRuns()
    install_exception_handlers(app)
    for module in (completions, chat, messages, responses_route, embeddings, score, classify, routes, sagemaker):
        module.add_routes(app)
    if config.allow_runtime_lora_updating:
        lora_routes.add_routes(app)
    # The web UI's pages and files load without a key (they hold no data); its data calls need one.
    ui_public_paths = add_ui_routes(app) if config.enable_ui else frozenset()
    # Adapters loaded at run time change the names a request may use: then the document lists none.
    model_names = None if config.allow_runtime_lora_updating else [*config.served_model_names, *config.lora_modules]
    install_openapi(app, model_names, PUBLIC_PATHS | ui_public_paths)
    # add_middleware puts each new one outside the previous ones.
    app.add_middleware(TaskGateMiddleware, task=lambda: ctx.limits.task)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=config.max_request_body_bytes)
    if config.api_key:
        app.add_middleware(AuthMiddleware, api_key=config.api_key, public_paths=PUBLIC_PATHS | ui_public_paths)
    app.add_middleware(GateMiddleware, max_header_bytes=config.max_request_header_bytes, is_draining=lambda: ctx.draining)
    return app


def _checked_adapters(engine, config: ServerConfig) -> dict[str, LoRARequest]:
    """The --lora-modules adapters, each checked by the engine now (a bad one stops the start-up)."""
    adapters = config.lora_requests()
    clashes = sorted(set(adapters) & set(config.served_model_names))
    if clashes:
        raise InvalidArgumentError(f"--lora-modules name {clashes[0]!r} is also a served model name", param="lora_modules")
    for lora in adapters.values():
        engine.check_lora_request(lora)
    return adapters


def _response_store(config: ServerConfig, api_server_index: int | None) -> ResponseStore:
    """Stored responses live in one process's memory: with several API processes none are kept."""
    if api_server_index is not None:
        why = "several API processes (--api-server-count): a later request may reach another"
        return ResponseStore(0, 0, why_off=why)
    return ResponseStore(config.max_stored_responses, config.max_stored_response_bytes)
