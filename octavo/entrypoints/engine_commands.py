"""What the event loop and the engine thread of ``AsyncEngine`` pass each
other: the commands (add, abort, stats, stop), each request's stream, the
observer that hears about requests, and the errors a stream can end with.

Futures and streams belong to the event loop: the engine thread only ever
resolves or fills them through ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Protocol

from octavo.core.lora_request import LoRARequest
from octavo.core.outputs import RequestOutput
from octavo.core.pooling_batch import PoolingBatch
from octavo.core.pooling_params import PoolingParams
from octavo.core.sampling_params import SamplingParams
from octavo.entrypoints.output_queue import OutputQueue
from octavo.errors import OctavoError


class ServerShuttingDownError(OctavoError):
    """The server stopped (or gave up draining) before the request finished."""

    http_status = 503
    error_type = "server_shutting_down"


class RequestFailedError(OctavoError):
    """The engine failed this one request (a bug, not bad input); it goes on with the others."""

    http_status = 500
    error_type = "internal_error"


class EngineObserver(Protocol):
    """Hears about requests on the engine thread (metrics); must be thread-safe.

    Its exceptions are logged and ignored: metrics never stop the engine."""

    def on_request_added(self, request_id: str, num_prompt_tokens: int, params: SamplingParams) -> None: ...

    def on_outputs(self, outputs: list[RequestOutput]) -> None: ...

    def on_request_aborted(self, request_id: str) -> None: ...

    def on_engine_restarted(self) -> None: ...


@dataclass(frozen=True)
class RequestOptions:
    """What a request asks of the engine beside its prompt and sampling (vLLM's request fields)."""

    # Salts the request's prefix-cache block hashes: requests share cached
    # blocks only with requests of the same salt (tenants do not see each other's hits).
    cache_salt: str | None = None
    # Lower first under --scheduling-policy priority; must be 0 under fcfs.
    priority: int = 0
    # The LoRA adapter the request's ``model`` names (--lora-modules); None: the base model.
    lora_request: LoRARequest | None = None


@dataclass
class AddCommand:
    request_id: str
    prompt: Any
    params: SamplingParams
    stream: RequestStream
    added: asyncio.Future
    options: RequestOptions = field(default_factory=RequestOptions)


@dataclass
class AddPoolingBatchCommand:
    """Many pooling inputs admitted together (``LLMEngine.add_pooling_requests``):
    all or none; ``streams[i]`` is ``batch.request_ids[i]``'s."""

    batch: PoolingBatch
    params: PoolingParams
    streams: list[RequestStream]
    added: asyncio.Future


@dataclass
class AbortCommand:
    request_ids: list[str]


@dataclass
class StatsCommand:
    result: asyncio.Future


@dataclass
class ResetPrefixCacheCommand:
    result: asyncio.Future  # True once every cached prefix is forgotten


STOP = object()


@dataclass
class RequestStream:
    """The event-loop side of one request: a queue of outputs, then an end."""

    request_id: str
    num_seqs: int
    # Outputs that wait for the event loop are merged (output_queue.py).
    queue: OutputQueue = field(default_factory=OutputQueue)
    finished: bool = False
    released: bool = False


def resolve(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def deliver(batch: list[tuple[RequestStream, RequestOutput]]) -> None:
    for stream, output in batch:
        if not stream.released:
            stream.queue.put_nowait(output)
