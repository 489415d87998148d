"""Admission into the async engine (``async_engine.py``): the event loop's
side (``add_request``, ``add_pooling_batch``: a stream per sequence, the
capacity check, one command to the engine thread, its answer awaited) and
the engine thread's (the engine's own add, its errors answered to the
waiting admission, the observer told). ``AsyncEngine`` inherits these; they
read its streams, counters, config and engine. The invariants are
``async_engine``'s: an admission is answered exactly once, all of a batch
is admitted or none, a failure to add one request fails it alone."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from octavo.core.pooling_batch import PoolingBatch
from octavo.core.pooling_params import PoolingParams
from octavo.core.sampling_params import RequestOutputKind, SamplingParams
from octavo.entrypoints.engine_commands import (
    AddCommand,
    AddPoolingBatchCommand,
    RequestFailedError,
    RequestOptions,
    RequestStream,
    resolve,
)
from octavo.entrypoints.output_queue import OutputQueue
from octavo.errors import EngineDeadError, OctavoError, QueueFullError

logger = logging.getLogger("octavo.entrypoints.async_engine")


class EngineAdmission:
    # ------------------------------------------------------------ event loop

    async def add_request(
        self, request_id: str, prompt: Any, params: SamplingParams, options: RequestOptions = RequestOptions()
    ) -> RequestStream:
        """Admit a request: raises (validation, queue full, dead engine) before it is scheduled.

        The caller owns the returned stream: iterate ``outputs(stream)`` or ``close(stream)`` it.
        """
        self._check_capacity(params.n)
        # PoolingParams have no output kind: their one output is final.
        delta = getattr(params, "output_kind", None) == RequestOutputKind.DELTA
        stream = RequestStream(request_id, params.n, OutputQueue(delta=delta))
        await self._admit([stream], lambda added: AddCommand(request_id, prompt, params, stream, added, options))
        return stream

    async def add_pooling_batch(self, batch: PoolingBatch, params: PoolingParams) -> list[RequestStream]:
        """Admit many pooling inputs in one command (``add_pooling_requests``:
        checked together, all queued or none); a stream per input, as ``add_request``
        gives. Only for an engine that takes batches (``takes_pooling_batches``)."""
        self._check_capacity(len(batch.request_ids))
        if not batch.request_ids:
            return []
        streams = [RequestStream(request_id, 1, OutputQueue()) for request_id in batch.request_ids]
        await self._admit(streams, lambda added: AddPoolingBatchCommand(batch, params, streams, added))
        return streams

    @property
    def takes_pooling_batches(self) -> bool:
        """Whether ``add_pooling_batch`` may be used: the engine has
        ``add_pooling_requests`` (``LLMEngine``, ``DataParallelEngine``)."""
        return getattr(self.engine, "add_pooling_requests", None) is not None

    def _check_capacity(self, num_seqs: int) -> None:
        """Raise the engine's error, or ``QueueFullError`` past ``max_inflight_seqs``."""
        if self._error is not None:
            raise self._error
        cap = self.config.max_inflight_seqs
        if cap is not None and self.num_inflight_seqs + num_seqs > cap:
            raise QueueFullError(
                f"the server is at capacity ({self.num_inflight_seqs} of {cap} sequences in flight); retry later"
            )

    async def _admit(self, streams: list[RequestStream], command: Callable[[asyncio.Future], Any]) -> None:
        """Count ``streams`` in, hand the engine thread ``command(added)`` and wait
        for its answer; on any failure (validation, a dead engine, the client
        gone while waiting) close them all."""
        added = asyncio.get_running_loop().create_future()
        self.num_inflight_seqs += sum(stream.num_seqs for stream in streams)
        self._streams.update((stream.request_id, stream) for stream in streams)
        self._adding.add(added)
        try:
            self._submit(command(added))
            await added
        except BaseException:
            for stream in streams:
                self.close(stream)
            raise
        finally:
            self._adding.discard(added)

    # ---------------------------------------------------------- engine thread

    def _apply_add(self, command: AddCommand) -> None:
        if command.added.done():  # cancelled while queued: the client is gone
            return
        options = command.options
        if not self._added(command.added, command.request_id, lambda: self.engine.add_request(
                command.request_id, command.prompt, command.params, options.cache_salt, options.priority,
                options.lora_request)):
            return
        self._engine_streams[command.request_id] = command.stream
        self._observe("on_request_added", command.request_id, self._num_prompt_tokens(command.prompt), command.params)
        self._call_in_loop(resolve, command.added, None, None)

    def _apply_add_batch(self, command: AddPoolingBatchCommand) -> None:
        if command.added.done():  # cancelled while queued: the client is gone
            return
        batch = command.batch
        if not self._added(command.added, batch.request_ids[0], lambda: self.engine.add_pooling_requests(batch, command.params)):
            return
        self._engine_streams.update(zip(batch.request_ids, command.streams))
        for request_id, token_ids in zip(batch.request_ids, batch.token_ids):
            self._observe("on_request_added", request_id, len(token_ids), command.params)
        self._call_in_loop(resolve, command.added, None, None)

    def _added(self, added: asyncio.Future, request_id: str, add) -> bool:
        """Run ``add()``; on failure answer ``added`` with the error and return
        False (a dead engine's error also stops the loop)."""
        try:
            add()
        except EngineDeadError as exc:
            self._call_in_loop(resolve, added, None, exc)
            raise
        except OctavoError as exc:
            self._call_in_loop(resolve, added, None, exc)
            return False
        except Exception as exc:  # a bug while adding this request: it fails, the engine goes on
            logger.exception("could not add request %s; the engine goes on without it", request_id)
            error = RequestFailedError(f"the engine could not add this request ({type(exc).__name__}; see the server log)")
            self._call_in_loop(resolve, added, None, error)
            return False
        return True

    def _observe(self, method: str, *args) -> None:
        if self.observer is None:
            return
        try:
            getattr(self.observer, method)(*args)
        except Exception:  # noqa: BLE001 - metrics must never stop the engine
            logger.exception("the engine observer failed in %s", method)

    def _num_prompt_tokens(self, prompt: Any) -> int:
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            return len(prompt["prompt_token_ids"])
        return len(self.engine.tokenize_prompt(prompt)[1])
