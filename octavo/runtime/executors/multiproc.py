"""The multiprocess executor: one spawned worker process per device.

Invariants:
- Every message on the pipes is msgpack bytes (``send_bytes`` /
  ``recv_bytes``). The only pickle involved is multiprocessing's own
  bootstrap of a spawned child (this module's function and bytes arguments,
  parent to child, before any message).
- A worker answers its calls in order; the output rank's answers to
  ``execute_model`` are matched first-in first-out to the pending outputs, so
  up to ``pipeline_parallel_size`` batches can be in flight.
- Every wait also watches all workers' process sentinels: a death is seen at
  once, not after a collective times out. From then on the executor is dead:
  the other workers are killed, pending and later calls raise
  ``EngineDeadError`` (while starting, a worker's own typed error, such as
  ``ModelLoadError``, is raised instead).
- A wait has a deadline (``OCTAVO_WORKER_START_TIMEOUT_S`` while starting,
  ``OCTAVO_EXECUTE_TIMEOUT_S`` per step); a worker that is alive but silent
  past it is treated as dead too.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import socket
import time
import weakref
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from octavo.core.scheduler_output import ModelRunnerOutput, SchedulerOutput
from octavo.distributed.parallel_state import output_rank
from octavo.errors import EngineDeadError, OctavoError
from octavo.runtime.config import WorkerConfig
from octavo.runtime.executors.worker_host import encode_call, encode_setup, run_worker_process, unpack_reply
from octavo.runtime.worker import RankInfo

logger = logging.getLogger(__name__)

START_TIMEOUT_S = float(os.environ.get("OCTAVO_WORKER_START_TIMEOUT_S", "900"))
EXECUTE_TIMEOUT_S = float(os.environ.get("OCTAVO_EXECUTE_TIMEOUT_S", "600"))


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class _WorkerProcess:
    rank: int
    process: multiprocessing.process.BaseProcess
    conn: Connection


class PendingOutput:
    """A batch in flight; ``result()`` waits for it (older batches first)."""

    def __init__(self, executor: "MultiprocExecutor") -> None:
        self._executor = executor
        self.done = False
        self.value: ModelRunnerOutput | None = None
        self.error: BaseException | None = None

    def result(self) -> ModelRunnerOutput:
        while not self.done:
            self._executor._collect_oldest()
        if self.error is not None:
            raise self.error
        return self.value


def kill_processes(processes: list) -> None:
    """Terminate, then kill what is still alive after a short grace period."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + 3.0
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join(1.0)


class MultiprocExecutor:
    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
        self.world_size = tp * pp
        self.max_concurrent_batches = pp
        self._output_rank = output_rank(tp, pp)
        self._dead: EngineDeadError | None = None
        self._started = False
        self._closed = False
        self._pending: deque[PendingOutput] = deque()
        # The most batches ever in flight at once (evidence that stages overlap).
        self.max_batches_in_flight = 0
        self._workers = self._spawn(config)
        self._finalizer = weakref.finalize(self, kill_processes, [w.process for w in self._workers])
        try:
            for worker in self._workers:  # each worker says it joined the group
                unpack_reply(self._recv(worker, START_TIMEOUT_S), worker.rank)
            self._call_all("load_model", timeout=START_TIMEOUT_S)
        except BaseException:
            self.shutdown()
            raise
        self._started = True

    def _spawn(self, config: WorkerConfig) -> list[_WorkerProcess]:
        context = multiprocessing.get_context("spawn")
        init_method = f"tcp://127.0.0.1:{free_loopback_port()}"
        workers = []
        for rank in range(self.world_size):
            parent_end, child_end = context.Pipe(duplex=True)
            info = RankInfo(rank, self.world_size, init_method, local_rank=config.device_index_offset + rank)
            process = context.Process(
                target=run_worker_process,
                args=(child_end, encode_setup(config, info), self.world_size),
                name=f"octavo-worker-{rank}",
                daemon=True,
            )
            process.start()
            child_end.close()
            workers.append(_WorkerProcess(rank, process, parent_end))
        return workers

    # ------------------------------------------------------------- protocol

    def determine_num_kv_blocks(self) -> int:
        # Every rank must hold the same blocks: the smallest budget wins.
        return min(self._call_all("determine_num_kv_blocks", timeout=START_TIMEOUT_S))

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self._call_all("initialize_kv_cache", num_blocks, timeout=START_TIMEOUT_S)

    def attention_backend_names(self) -> list[str]:
        # Pipeline stages hold different layers: the union over ranks.
        return sorted(set().union(*self._call_all("attention_backend_names", timeout=START_TIMEOUT_S)))

    def lora_targets(self) -> dict[str, tuple[int, int]]:
        # Asked once at start-up, before any step is in flight; every rank holds every layer (no PP with LoRA).
        return {name: tuple(sizes) for name, sizes in self._call_all("lora_targets", timeout=START_TIMEOUT_S)[0].items()}

    def reload_weights(self, weights_path: str | None) -> list[int]:
        return self._call_all("reload_weights", weights_path, timeout=START_TIMEOUT_S)

    def execute_model(self, scheduler_output: SchedulerOutput, non_block: bool = False):
        self._raise_if_dead()
        self._send_all(encode_call("execute_model", scheduler_output))
        pending = PendingOutput(self)
        self._pending.append(pending)
        self.max_batches_in_flight = max(self.max_batches_in_flight, len(self._pending))
        return pending if non_block else pending.result()

    def check_health(self) -> None:
        self._raise_if_dead()
        for worker in self._workers:
            if not worker.process.is_alive():
                raise self._fail(self._death_error(worker))

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for worker in self._workers:
            if worker.process.is_alive():
                try:
                    worker.conn.send_bytes(encode_call("shutdown"))
                except OSError:
                    pass
        deadline = time.monotonic() + 5.0
        for worker in self._workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
        kill_processes([w.process for w in self._workers])
        for worker in self._workers:
            worker.conn.close()
        self._finalizer.detach()
        if self._dead is None:
            self._dead = EngineDeadError("the executor was shut down")
        self._fail_pending(self._dead)

    @property
    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    # -------------------------------------------------------------- helpers

    def _call_all(self, method: str, *args: Any, timeout: float) -> list[Any]:
        self._raise_if_dead()
        self._send_all(encode_call(method, *args))
        results = []
        for worker in self._workers:
            data = self._recv(worker, timeout)
            try:
                results.append(unpack_reply(data, worker.rank))
            except OctavoError as exc:
                raise self._fail(exc) from None
        return results

    def _collect_oldest(self) -> None:
        self._raise_if_dead()
        worker = self._workers[self._output_rank]
        data = self._recv(worker, EXECUTE_TIMEOUT_S)
        try:
            value = unpack_reply(data, worker.rank)
        except OctavoError as exc:
            raise self._fail(exc) from None
        pending = self._pending.popleft()
        pending.value, pending.done = value, True

    def _send_all(self, data: bytes) -> None:
        for worker in self._workers:
            try:
                worker.conn.send_bytes(data)
            except OSError:
                raise self._fail(self._death_error(worker)) from None

    def _recv(self, worker: _WorkerProcess, timeout: float) -> bytes:
        """The next message from ``worker``, watching every worker's death."""
        deadline = time.monotonic() + timeout
        sentinels = {w.process.sentinel: w for w in self._workers}
        while True:
            if worker.conn.poll(0):
                try:
                    return worker.conn.recv_bytes()
                except (EOFError, OSError):
                    raise self._fail(self._death_error(worker)) from None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._fail(
                    EngineDeadError(f"worker rank {worker.rank} did not answer within {timeout:.0f} s")
                )
            for ready in wait([worker.conn, *sentinels], timeout=remaining):
                if ready is not worker.conn and not worker.conn.poll(0):
                    raise self._fail(self._death_error(sentinels[ready]))

    def _root_cause(self, error: BaseException) -> BaseException:
        """A worker's reported error, or the death of a peer that caused it.

        When a rank is killed, its peers' collectives fail ("connection
        reset") and their error replies can arrive before its death is seen;
        the death is the cause to report. A worker that reported an error
        exits with code 1; one that was killed or crashed has another code."""
        reporter = getattr(error, "worker_rank", None)
        others = [w for w in self._workers if w.rank != reporter]
        if reporter is None or not others:
            return error
        wait([w.process.sentinel for w in others], timeout=1.0)
        for worker in others:
            if not worker.process.is_alive() and worker.process.exitcode != 1:
                return EngineDeadError(f"{self._death_error(worker)} (then worker rank {reporter} failed: {error})")
        return error

    def _death_error(self, worker: _WorkerProcess) -> BaseException:
        """Why ``worker`` is gone: its last error reply, else its exit code."""
        try:
            while worker.conn.poll(0):
                unpack_reply(worker.conn.recv_bytes(), worker.rank)
        except OctavoError as exc:
            return exc
        except (EOFError, OSError):
            pass
        worker.process.join(1.0)
        return EngineDeadError(
            f"worker rank {worker.rank} (pid {worker.process.pid}) died unexpectedly "
            f"(exit code {worker.process.exitcode})"
        )

    def _fail(self, error: BaseException) -> BaseException:
        """Mark the executor dead, kill the workers; the error to raise."""
        if self._dead is None and self._started:
            error = self._root_cause(error)
        dead = error if isinstance(error, EngineDeadError) else EngineDeadError(str(error))
        if self._dead is None:
            logger.error("distributed executor failed: %s", dead)
            self._dead = dead
            kill_processes([w.process for w in self._workers])
        self._fail_pending(self._dead)
        # While starting, a worker's typed error (e.g. ModelLoadError) says more.
        return error if not self._started and isinstance(error, OctavoError) else self._dead

    def _fail_pending(self, error: EngineDeadError) -> None:
        while self._pending:
            pending = self._pending.popleft()
            pending.error, pending.done = error, True

    def _raise_if_dead(self) -> None:
        if self._dead is not None:
            raise self._dead
