"""The worker side of the executor protocol: msgpack calls in, replies out.

A call is ``encode([method, args])``; a reply is ``encode(["ok", value])``
or ``encode(["error", class name, message, param, traceback])``. The same
host serves a multiprocess worker (over a pipe) and a Ray actor (bytes in,
bytes out), so both speak exactly the same protocol.

Invariants:
- Only the methods in ``METHODS`` can be called.
- ``execute_model`` is answered only by the output rank (tensor rank 0 of the
  last pipeline stage); the other ranks answer only on error. Every other
  call is answered by every rank.
- A worker that fails a call replies with the error and then stops serving
  (its process exits): after a failed collective the process group is
  unusable, so the executor treats any failure as the worker's death.
"""

from __future__ import annotations

import logging
import os
import traceback
from dataclasses import asdict
from typing import Any

import octavo.errors
from octavo.distributed.inbox import Inbox
from octavo.distributed.parallel_state import output_rank
from octavo.distributed.serialization import decode, encode
from octavo.runtime.config import WorkerConfig
from octavo.runtime.worker import RankInfo, Worker

logger = logging.getLogger(__name__)

METHODS = frozenset(
    {
        "load_model", "determine_num_kv_blocks", "initialize_kv_cache", "attention_backend_names", "lora_targets",
        "execute_model", "shutdown", "reload_weights",
    }
)


def encode_call(method: str, *args: Any) -> bytes:
    return encode([method, list(args)])


def encode_error(exc: BaseException) -> bytes:
    param = getattr(exc, "param", None)
    text = "".join(traceback.format_exception(exc))
    return encode(["error", type(exc).__name__, str(exc), param if isinstance(param, str) else None, text])


def unpack_reply(data: bytes, rank: int) -> Any:
    """The value of an "ok" reply; raise the error of an "error" reply.

    A worker's user-facing error (``ModelLoadError`` while loading, ...) is
    raised as the same type; anything else becomes ``EngineDeadError``."""
    reply = decode(data)
    if reply[0] == "ok":
        return reply[1]
    _, name, message, param, text = reply
    cls = getattr(octavo.errors, name, None)
    if isinstance(cls, type) and issubclass(cls, octavo.errors.OctavoError):
        error = cls(message, param=param)
    else:
        logger.error("worker rank %d failed:\n%s", rank, text)
        error = octavo.errors.EngineDeadError(f"worker rank {rank} failed: {name}: {message}")
    error.worker_rank = rank
    raise error


def encode_setup(config: WorkerConfig, rank_info: RankInfo) -> bytes:
    return encode([config, asdict(rank_info)])


def limit_cpu_threads(num_local_workers: int) -> None:
    """Share the host's cores between the workers of one host, unless the
    user already chose (OMP_NUM_THREADS): oversubscribed CPU collectives
    slow everything down."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, num_local_workers)))


class WorkerHost:
    def __init__(self, setup: bytes) -> None:
        config, rank_info = decode(setup)
        self.rank_info = RankInfo(**rank_info)
        self.is_output_rank = self.rank_info.rank == output_rank(
            config.tensor_parallel_size, config.pipeline_parallel_size
        )
        self.worker = Worker(config, rank_info=self.rank_info)
        self.failed = False
        self.stopped = False

    def handle(self, message: bytes) -> bytes | None:
        """Run one call; the reply to send, or None (nothing to send)."""
        method = None
        try:
            method, args = decode(message)
            if method not in METHODS:
                raise ValueError(f"unknown worker method {method!r}")
            result = getattr(self.worker, method)(*args)
            self.stopped = method == "shutdown"
        except BaseException as exc:  # noqa: BLE001 - reported to the engine, then this worker stops
            logger.error("worker rank %d failed in %s", self.rank_info.rank, method, exc_info=True)
            self.failed = True
            return encode_error(exc)
        if method == "execute_model" and not self.is_output_rank:
            return None
        return encode(["ok", result])


def exit_process(code: int) -> None:
    """End a spawned worker at once: a normal interpreter exit would tear
    down torch and its process groups, which takes seconds and helps no one."""
    import sys

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_worker_process(conn, setup: bytes, num_local_workers: int) -> None:
    """Entry point of a multiprocess worker (spawned; ``conn`` is its pipe end).

    Ends when asked to shut down, after a failure, or when the engine's end
    of the pipe closes (the engine process is gone)."""
    logging.basicConfig(level=os.environ.get("OCTAVO_LOG_LEVEL", "WARNING"))
    limit_cpu_threads(num_local_workers)
    try:
        host = WorkerHost(setup)
    except BaseException as exc:  # noqa: BLE001
        conn.send_bytes(encode_error(exc))
        exit_process(1)
    conn.send_bytes(encode(["ok", None]))
    inbox = Inbox(conn)
    while True:
        message = inbox.get()
        if message is None:
            break  # the engine is gone
        reply = host.handle(message)
        if reply is not None:
            conn.send_bytes(reply)
        if host.failed:
            exit_process(1)
        if host.stopped:
            break
    conn.close()
    exit_process(0)
