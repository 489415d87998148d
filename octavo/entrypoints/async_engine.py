"""The synchronous engine (an ``LLMEngine`` or a ``DataParallelEngine``, same
interface) driven from a dedicated thread, for asyncio front ends.

Invariants:

* Only the engine thread touches the engine (add, abort, step, stats), but
  for a data-parallel engine's thread-safe ``wake()``: the event loop calls
  it after each command, so a ``step()`` waiting for replica outputs returns.
  The event loop hands it commands through a thread-safe queue and hears back
  through ``loop.call_soon_threadsafe``: one call per engine step, carrying all
  of that step's outputs, so that many streams cost one wake-up, not many.
* Every admitted request ends with exactly one terminal item in its stream: a
  finished ``RequestOutput`` or an exception. Engine death and shutdown fail
  every live stream and every pending command, so nothing waits forever.
* Aborts are idempotent and run on the engine thread, which frees the
  request's KV blocks before the next step (a data-parallel engine forwards
  the abort to the replica that holds the request).
* An idle engine is asked ``check_health()`` every ``IDLE_HEALTH_CHECK_S``:
  a worker or replica that dies while no request runs still stops the loop
  (and turns ``/health`` to 503); while requests run, ``step()`` notices.
* Admission is bounded: at most ``max_inflight_seqs`` sequences (a request
  with ``n`` choices counts ``n``) are in the engine at once; past that,
  ``QueueFullError`` is raised at once instead of queueing without bound.
* A failure that belongs to one request stays with it: an exception while
  adding it fails only its admission (``RequestFailedError`` unless it is a
  typed error), and an output the engine finished with ``"error"`` ends its
  stream with ``RequestFailedError``; the loop goes on. Anything else that
  escapes the engine (a model step that raised, a dead worker) stops the
  loop: every request in flight, admitted or still being admitted, fails at
  once with ``EngineDeadError``, and so does every later one, until a
  restarter (``--restart-engine``) hands over a new engine.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from octavo.core.engine import LLMEngine
from octavo.core.outputs import RequestOutput
from octavo.core.sampling_params import SamplingParams
from octavo.core.scheduler import SchedulerStats
from octavo.entrypoints.engine_commands import (
    STOP,
    AbortCommand,
    AddCommand,
    AddPoolingBatchCommand,
    EngineObserver,
    RequestFailedError,
    RequestOptions,
    RequestStream,
    ResetPrefixCacheCommand,
    ServerShuttingDownError,
    StatsCommand,
    deliver,
    resolve,
)
from octavo.entrypoints.engine_admission import EngineAdmission
from octavo.entrypoints.engine_restart import EngineRestarter
from octavo.entrypoints.engine_stats import EngineSnapshot, take_snapshot
from octavo.errors import EngineDeadError, OctavoError

if TYPE_CHECKING:
    from octavo.distributed.data_parallel import DataParallelEngine

logger = logging.getLogger(__name__)

IDLE_HEALTH_CHECK_S = 1.0


@dataclass
class AsyncEngineConfig:
    # Admission cap on sequences in the engine (running plus waiting); None: no cap.
    max_inflight_seqs: int | None = None


class AsyncEngine(EngineAdmission):
    def __init__(
        self,
        engine: LLMEngine | DataParallelEngine,
        config: AsyncEngineConfig | None = None,
        observer: EngineObserver | None = None,
        restarter: EngineRestarter | None = None,
    ) -> None:
        self.engine = engine
        self.config = config or AsyncEngineConfig()
        self.observer = observer
        self.restarter = restarter
        self.last_snapshot: EngineSnapshot = take_snapshot(engine)
        self.num_inflight_seqs = 0
        self.started_at = int(time.time())
        self._lock = threading.Lock()  # orders "is the thread alive?" with enqueueing
        self._error: OctavoError | None = None
        self._stopping = False
        self._streams: dict[str, RequestStream] = {}  # event-loop side, live requests
        self._adding: set[asyncio.Future] = set()  # event-loop side, admissions not yet answered
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._reset_engine_side(engine)

    def _reset_engine_side(self, engine) -> None:
        """The engine thread's state, fresh for ``engine`` (at start, and after a restart)."""
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_engine = getattr(engine, "wake", None)
        self._thread_dead = False
        self._engine_streams: dict[str, RequestStream] = {}

    # --------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start the engine thread; call from the event loop that will use the engine."""
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="octavo-engine", daemon=True)
        self._thread.start()

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and not self._thread_dead and self._error is None

    @property
    def error(self) -> OctavoError | None:
        return self._error

    async def shutdown(self) -> None:
        """Stop the thread (aborting what is left in the engine) and release the model."""
        self._stopping = True
        if self._error is None:
            self._error = ServerShuttingDownError("the server is shutting down")
        self._fail_streams(self._error)
        if self.restarter is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.restarter.stop)
        with self._lock:
            alive = not self._thread_dead
            if alive:
                self._commands.put(STOP)
        if alive and self._wake_engine is not None:
            self._wake_engine()
        if self._thread is not None and alive:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
        self.engine.shutdown()

    # ---------------------------------------------------------------- requests

    async def generate(
        self, request_id: str, prompt: Any, params: SamplingParams, options: RequestOptions = RequestOptions()
    ) -> AsyncIterator[RequestOutput]:
        """Admit a request and yield its outputs; closing the iterator early aborts it."""
        stream = await self.add_request(request_id, prompt, params, options)
        try:
            async for output in self.outputs(stream):
                yield output
        finally:
            # An abandoned inner generator is finalized only by the garbage collector.
            self.close(stream)

    async def outputs(self, stream: RequestStream) -> AsyncIterator[RequestOutput]:
        """The stream's outputs up to the finished one; an engine failure raises here."""
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                if item.finished and item.failed:
                    stream.finished = True  # the engine has already let go of it
                    raise RequestFailedError("the engine failed while running this request (see the server log)")
                yield item
                if item.finished:
                    stream.finished = True
                    return
        finally:
            self.close(stream)

    def close(self, stream: RequestStream) -> None:
        """Abort the request unless it finished, and stop counting it (idempotent)."""
        if not stream.finished:
            self.abort(stream.request_id)
        self._release(stream)

    def abort(self, request_id: str) -> None:
        """Abort a request (idempotent; unknown ids are ignored)."""
        self._try_submit(AbortCommand([request_id]))

    def abort_all(self, error: OctavoError) -> None:
        """End every live request with ``error`` and abort it in the engine."""
        request_ids = list(self._streams)
        self._fail_streams(error)
        if request_ids:
            self._try_submit(AbortCommand(request_ids))

    def abort_all_after(self, delay: float, error: OctavoError) -> None:
        """``abort_all(error)`` in ``delay`` seconds; safe from any thread or a signal handler."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._loop.call_later, delay, self.abort_all, error)

    @property
    def last_stats(self) -> SchedulerStats:
        return self.last_snapshot.stats

    async def get_stats(self) -> SchedulerStats:
        """Fresh scheduler stats from the engine thread (the last ones if it is dead)."""
        return (await self.get_snapshot()).stats

    async def get_snapshot(self) -> EngineSnapshot:
        """Fresh stats (per replica too, if data parallel); the last ones if the engine is dead."""
        future = asyncio.get_running_loop().create_future()
        if not self._try_submit(StatsCommand(future)):
            return self.last_snapshot
        try:
            return await future
        except OctavoError:
            return self.last_snapshot

    async def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix, on the engine thread; False while requests hold blocks."""
        future = asyncio.get_running_loop().create_future()
        self._submit(ResetPrefixCacheCommand(future))
        return await future

    def _release(self, stream: RequestStream) -> None:
        if stream.released:
            return
        stream.released = True
        self.num_inflight_seqs -= stream.num_seqs
        if self._streams.get(stream.request_id) is stream:
            del self._streams[stream.request_id]

    def _fail_streams(self, error: BaseException) -> None:
        for stream in list(self._streams.values()):
            stream.queue.put_nowait(error)
            self._release(stream)

    def _submit(self, command: Any) -> None:
        if not self._try_submit(command):
            raise self._error or EngineDeadError("the engine loop is not running")

    def _try_submit(self, command: Any) -> bool:
        with self._lock:
            if self._thread_dead or self._thread is None:
                return False
            self._commands.put(command)
        if self._wake_engine is not None:
            self._wake_engine()
        return True

    # ----------------------------------------------------------- engine thread

    def _run(self) -> None:
        try:
            while True:
                block = not self.engine.has_unfinished_requests()
                for command in self._next_commands(block):
                    if command is STOP:
                        self._stop_engine()
                        return
                    self._apply(command)
                if self.engine.has_unfinished_requests():
                    self._publish(self.engine.step())
        except BaseException as exc:  # the engine is in an unknown state: stop
            logger.exception("the engine loop failed; failing all requests in flight")
            self._die(exc)

    def _next_commands(self, block: bool) -> list[Any]:
        commands = []
        while block:
            try:
                commands.append(self._commands.get(timeout=IDLE_HEALTH_CHECK_S))
                break
            except queue.Empty:
                self.engine.check_health()  # raises once a worker or replica is gone
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands

    def _apply(self, command: Any) -> None:
        if isinstance(command, AddCommand):
            self._apply_add(command)
        elif isinstance(command, AddPoolingBatchCommand):
            self._apply_add_batch(command)
        elif isinstance(command, AbortCommand):
            live = [r for r in command.request_ids if self._engine_streams.pop(r, None) is not None]
            if live:
                self.engine.abort_request(live)
                for request_id in live:
                    self._observe("on_request_aborted", request_id)
        elif isinstance(command, StatsCommand):
            try:
                self.last_snapshot = take_snapshot(self.engine)
            finally:  # a replica that died while answering still leaves the scrape an answer
                self._call_in_loop(resolve, command.result, self.last_snapshot, None)
        elif isinstance(command, ResetPrefixCacheCommand):
            try:
                done = self.engine.reset_prefix_cache()
            except BaseException as exc:  # a dead replica: the caller hears it, the loop dies as usual
                error = exc if isinstance(exc, OctavoError) else EngineDeadError(f"{type(exc).__name__}: {exc}")
                self._call_in_loop(resolve, command.result, None, error)
                raise
            self._call_in_loop(resolve, command.result, done, None)

    def _publish(self, outputs: list[RequestOutput]) -> None:
        if not outputs:
            return
        batch = []
        for output in outputs:
            stream = self._engine_streams.get(output.request_id)
            if stream is None:
                continue
            if output.finished:
                del self._engine_streams[output.request_id]
            batch.append((stream, output))
        self._observe("on_outputs", outputs)
        if batch:
            self._call_in_loop(deliver, batch)

    def _stop_engine(self) -> None:
        request_ids = list(self._engine_streams)
        self._engine_streams.clear()
        if request_ids:
            self.engine.abort_request(request_ids)
            for request_id in request_ids:
                self._observe("on_request_aborted", request_id)
        with self._lock:
            self._thread_dead = True

    def _die(self, exc: BaseException) -> None:
        with self._lock:
            self._thread_dead = True
            pending = self._next_commands(block=False)
        for request_id in self._engine_streams:
            self._observe("on_request_aborted", request_id)
        self._engine_streams.clear()
        self._call_in_loop(self._on_death, exc, pending)

    def _on_death(self, exc: BaseException, pending: list[Any]) -> None:
        restarting = self.restarter is not None and not self._stopping
        suffix = "; it is restarting" if restarting else ""
        self._error = EngineDeadError(f"the engine loop failed: {type(exc).__name__}: {exc}{suffix}")
        for command in pending:
            if isinstance(command, StatsCommand):
                resolve(command.result, self.last_snapshot, None)
            elif isinstance(command, ResetPrefixCacheCommand):
                resolve(command.result, None, self._error)
        # Admissions still waiting for an answer, including the one the engine died on.
        for added in list(self._adding):
            resolve(added, None, self._error)
        self._fail_streams(self._error)
        if restarting:
            self.restarter.restart(self.engine, lambda engine: self._call_in_loop(self._install, engine))

    def _install(self, engine) -> None:
        """Take over a restarted engine (event loop)."""
        if self._stopping:  # the server is going down: so does the new engine, before the process exits
            engine.shutdown()
            return
        with self._lock:
            self.engine = engine
            self._reset_engine_side(engine)
        self._error = None
        self._observe("on_engine_restarted")  # before the new thread touches the observer
        self._thread = threading.Thread(target=self._run, name="octavo-engine", daemon=True)
        self._thread.start()

    def _call_in_loop(self, callback, *args) -> None:
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

