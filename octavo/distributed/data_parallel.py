"""Data parallelism: N engine replicas, each in its own process, behind the
``LLMEngine`` interface.

``DataParallelEngine`` offers what front ends use of an ``LLMEngine``
(``add_request``, ``step``, ``abort_request``, ``has_unfinished_requests``,
``get_stats``, ``check_health``, ``shutdown``; ``tokenizer``, ``limits``,
``info``), so ``LLM`` and the server can use either. ``build_engine`` returns
one when ``data_parallel_size > 1``.

Invariants:
- Input is validated here, with the same code as ``LLMEngine``
  (``RequestValidator`` plus the scheduler's admission check), so bad input
  raises a typed error from ``add_request`` before anything is sent.
  ``add_request`` never waits for a replica.
- A request lives on exactly one replica, chosen by ``PrefixAwareRouter``
  (load, with prefix-cache affinity). Replica ``r``'s workers use the devices
  from ``r * tp * pp`` on.
- Replicas step on their own and push their outputs; ``step()`` returns what
  has arrived, waiting at most ``STEP_WAIT_S`` for the first output, so a
  caller's loop never blocks long while new requests wait to be added; a
  caller on another thread that has new work calls ``wake()`` (the only
  method safe from another thread) to end that wait at once.
- Messages are msgpack (``dp_replica`` lists them); a replica's death, or its
  engine's, makes this engine dead: every unfinished request fails with
  ``EngineDeadError``, the other replicas are shut down, later calls raise.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import multiprocessing
import socket
import time
import weakref
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

from octavo.core.engine import POOLING_SAMPLING_PARAMS, RequestValidator, check_priority, failed_output
from octavo.core.lora_request import LoRARequest, request_cache_key
from octavo.core.outputs import RequestOutput
from octavo.core.pooling_batch import PoolingBatch
from octavo.core.pooling_params import PoolingParams
from octavo.core.request import Request
from octavo.core.sampling_params import SamplingParams
from octavo.core.scheduler import SchedulerStats, check_admissible
from octavo.core.types import RequestId
from octavo.distributed.dp_pooling import add_pooling_batch
from octavo.distributed.dp_replica import run_replica_process
from octavo.distributed.dp_router import PrefixAwareRouter
from octavo.distributed.front_outputs import FrontOutputs
from octavo.distributed.peer_process import PeerProcess
from octavo.distributed.replica_stats import ReplicaStats, combine_replica_stats
from octavo.distributed.serialization import decode, encode
from octavo.errors import EngineDeadError, InvalidArgumentError
from octavo.runtime.executors.multiproc import START_TIMEOUT_S, kill_processes
from octavo.runtime.executors.worker_host import unpack_reply

logger = logging.getLogger(__name__)

STEP_WAIT_S = 0.05
REPLY_TIMEOUT_S = 600.0


@dataclass
class _Replica:
    index: int
    process: multiprocessing.process.BaseProcess
    conn: Connection
    replies: deque


def spawn_replicas(args, num_fronts: int = 1) -> tuple[list, list[list[Connection]]]:
    """Start ``args.data_parallel_size`` replica processes, each with a pipe
    to every front; return the processes and, per front, its pipe ends (one
    per replica)."""
    context = multiprocessing.get_context("spawn")
    processes, front_ends = [], [[] for _ in range(num_fronts)]
    for index in range(args.data_parallel_size):
        pipes = [context.Pipe(duplex=True) for _ in range(num_fronts)]
        replica_args = dataclasses.replace(args, data_parallel_rank=index)
        # Not a daemon: a replica may start worker processes of its own.
        process = context.Process(
            target=run_replica_process,
            args=([child for _, child in pipes], encode(dataclasses.asdict(replica_args))),
            name=f"octavo-dp-replica-{index}",
        )
        process.start()
        for front, (parent_end, child_end) in enumerate(pipes):
            child_end.close()
            front_ends[front].append(parent_end)
        logger.info("engine replica %d started in its own process (pid %d)", index, process.pid)
        processes.append(process)
    return processes, front_ends


class DataParallelEngine(RequestValidator):
    def __init__(self, args, links: list[Connection] | None = None, pids: list[int] | None = None) -> None:
        """Start the replicas, or with ``links`` (one pipe end per replica, and
        their ``pids``) talk to replicas another process started and owns."""
        from octavo.engine_args import load_engine_tokenizer

        self.num_replicas = args.data_parallel_size
        self._dead: EngineDeadError | None = None
        self._closed = False
        self._outputs: deque[RequestOutput] = deque()
        self._counter = itertools.count()
        # wake() may run on another thread at any time, so these are never
        # closed explicitly (a file descriptor closed under it could be
        # reused); they close with this object.
        self._wake_recv, self._wake_send = socket.socketpair()
        self._wake_recv.setblocking(False)
        self._wake_send.setblocking(False)
        self._owns_replicas = links is None
        if links is None:
            processes, (links,) = spawn_replicas(args)
        else:
            processes = [PeerProcess(pid) for pid in pids]
        self._replicas = [_Replica(i, process, conn, deque()) for i, (process, conn) in enumerate(zip(processes, links))]
        self._finalizer = weakref.finalize(self, kill_processes, [r.process for r in self._replicas])
        try:
            # While the replicas start (seconds): the front's own tokenizer.
            self.tokenizer = load_engine_tokenizer(args)
            ready = [unpack_reply(self._recv_raw(r, START_TIMEOUT_S), r.index) for r in self._replicas]
            # The replicas send token ids; text and RequestOutputs are made here.
            self._front = FrontOutputs(self.tokenizer)
        except BaseException:
            self.shutdown()
            raise
        self.limits, self.info, self.scheduler_config, _ = ready[0]
        # A request must fit on whichever replica it is routed to.
        self.replica_num_kv_blocks = [r[3] for r in ready]
        self.num_kv_blocks = min(self.replica_num_kv_blocks)
        self._num_finished = [0] * self.num_replicas
        self.router = PrefixAwareRouter(self.num_replicas, self.limits.block_size)

    # ---------------------------------------------------------------- input

    def add_request(
        self,
        request_id: str | None,
        prompt: str | list[int] | dict,
        params: SamplingParams | PoolingParams,
        cache_salt: str | None = None,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
    ) -> str:
        self._raise_if_dead()
        check_priority(priority, self.scheduler_config.policy)
        if request_id is None:
            request_id = f"dp-{next(self._counter)}"
        if self.router.replica_of(request_id) is not None:
            raise InvalidArgumentError(f"request id {request_id!r} is already in use", param="request_id")
        prompt_text, prompt_token_ids = self.prepare_prompt(prompt, params)
        self.validate(prompt_token_ids, params)
        images = self.image_features(prompt, prompt_token_ids, params)
        pooling = params if isinstance(params, PoolingParams) else None
        self.check_lora_request(lora_request, pooling=pooling is not None)
        engine_prompt = {"prompt": prompt_text, "prompt_token_ids": prompt_token_ids}
        if images:
            engine_prompt["image_features"] = list(images)
        if pooling is not None and isinstance(prompt, dict) and prompt.get("token_type_ids") is not None:
            self.validate_token_type_ids(prompt_token_ids, prompt["token_type_ids"])
            engine_prompt["token_type_ids"] = list(prompt["token_type_ids"])
        max_tokens = self.max_new_tokens(prompt_token_ids, params)
        # The same Request the replica will build: its admission check and its
        # block hashes (salted like the replica's prefix cache) for routing.
        probe = Request(
            RequestId(request_id), prompt_token_ids, params if pooling is None else POOLING_SAMPLING_PARAMS,
            max_tokens=max_tokens, block_size=self.limits.block_size,
            cache_key=request_cache_key(cache_salt, lora_request), pooling_params=pooling, image_features=images,
        )
        check_admissible(probe, self.scheduler_config, self.num_kv_blocks, self.limits.block_size)
        decision = self.router.choose(probe.block_hashes)
        replica = self._replicas[decision.replica]
        message = ["add", request_id, engine_prompt, params, cache_salt, priority, lora_request]
        self._send(replica, message)
        cost = self.router.cost(len(prompt_token_ids), max_tokens) * params.n
        self.router.add(request_id, decision, probe.block_hashes, cost)
        self._front.add(request_id, prompt_text, prompt_token_ids, params)
        return request_id

    def add_pooling_requests(self, batch: PoolingBatch, params: PoolingParams) -> None:
        """``add_request`` for many pooling inputs at once, all checked before
        any is sent, all to one replica (``dp_pooling``)."""
        self._raise_if_dead()
        add_pooling_batch(self, batch, params)

    def abort_request(self, request_ids: str | list[str]) -> None:
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        by_replica: dict[int, list[str]] = {}
        for request_id in request_ids:
            index = self.router.replica_of(request_id)
            if index is not None:
                by_replica.setdefault(index, []).append(request_id)
                self.router.remove(request_id)
                self._front.drop(request_id)
        if self._dead is None:
            for index, ids in by_replica.items():
                self._send(self._replicas[index], ["abort", ids])

    # ----------------------------------------------------------------- loop

    def has_unfinished_requests(self) -> bool:
        return any(load.num_requests for load in self.router.loads) or bool(self._outputs)

    def step(self) -> list[RequestOutput]:
        self._raise_if_dead()
        if not self._outputs and self.has_unfinished_requests():
            self._pump(STEP_WAIT_S)
        outputs = list(self._outputs)
        self._outputs.clear()
        for output in outputs:
            if output.finished:
                self.router.remove(output.request_id)
        return outputs

    def get_stats(self) -> SchedulerStats:
        """The replicas' stats combined (see ``combine_replica_stats``)."""
        return combine_replica_stats(self.get_replica_report())

    def reset_prefix_cache(self) -> bool:
        """Every replica forgets its cached prefixes; False if one could not (a request holds blocks)."""
        return all([self._ask(replica, "reset_prefix_cache") for replica in self._replicas])

    def get_replica_stats(self) -> list[SchedulerStats]:
        return [self._ask(replica, "stats") for replica in self._replicas]

    def get_replica_report(self) -> list[ReplicaStats]:
        """Each replica's stats (one question to each) and routing counters."""
        return [
            ReplicaStats(
                replica=replica.index,
                scheduler=self._ask(replica, "stats"),
                num_kv_blocks=self.replica_num_kv_blocks[replica.index],
                num_requests_routed=self.router.loads[replica.index].num_routed,
                num_requests_finished=self._num_finished[replica.index],
            )
            for replica in self._replicas
        ]

    def check_health(self) -> None:
        self._raise_if_dead()
        for replica in self._replicas:
            if not replica.process.is_alive():
                raise self._fail(f"data-parallel replica {replica.index} died (exit code {replica.process.exitcode})")
        for replica in self._replicas:
            problem = self._ask(replica, "health")
            if problem is not None:
                raise self._fail(f"data-parallel replica {replica.index}: {problem}")

    def wake(self) -> None:
        """End a ``step()`` that is waiting for outputs (thread-safe)."""
        try:
            self._wake_send.send(b"\0")
        except OSError:  # the buffer is full: a wake-up is pending already
            pass

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for replica in self._replicas:
            if replica.process.is_alive():
                try:
                    replica.conn.send_bytes(encode(["shutdown"]))
                except OSError:
                    pass
        deadline = time.monotonic() + 15.0
        for replica in self._replicas:
            if self._owns_replicas:  # else the launcher stops them once every front has left
                replica.process.join(max(0.0, deadline - time.monotonic()))
        kill_processes([r.process for r in self._replicas])
        for replica in self._replicas:
            replica.conn.close()
        self._finalizer.detach()
        if self._dead is None:
            self._dead = EngineDeadError("the engine was shut down")

    # -------------------------------------------------------------- helpers

    def _send(self, replica: _Replica, message: list) -> None:
        try:
            replica.conn.send_bytes(encode(message))
        except OSError:
            raise self._fail(f"data-parallel replica {replica.index} is gone") from None

    def _ask(self, replica: _Replica, kind: str):
        self._raise_if_dead()
        self._send(replica, [kind])
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while not replica.replies:
            if time.monotonic() > deadline:
                raise self._fail(f"data-parallel replica {replica.index} did not answer {kind!r}")
            self._pump(1.0)
        reply = replica.replies.popleft()
        return reply[1]

    def _pump(self, timeout: float) -> None:
        """Read every message that arrives within ``timeout`` (at least one wait)."""
        conns = {r.conn: r for r in self._replicas}
        sentinels = {r.process.sentinel: r for r in self._replicas if r.process.sentinel is not None}
        for ready in wait([*conns, *sentinels, self._wake_recv], timeout=timeout):
            if ready is self._wake_recv:
                self._clear_wake()
                continue
            replica = conns.get(ready) or sentinels[ready]
            self._drain(replica)
            if ready in sentinels and not replica.process.is_alive():
                raise self._fail(f"data-parallel replica {replica.index} died (exit code {replica.process.exitcode})")

    def _clear_wake(self) -> None:
        try:
            while self._wake_recv.recv(4096):
                pass
        except OSError:  # nothing left to read
            pass

    def _drain(self, replica: _Replica) -> None:
        try:
            while replica.conn.poll(0):
                self._dispatch(replica, decode(replica.conn.recv_bytes()))
        except (EOFError, OSError):
            replica.process.join(1.0)
            raise self._fail(f"data-parallel replica {replica.index} died (exit code {replica.process.exitcode})") from None

    def _dispatch(self, replica: _Replica, message: list) -> None:
        kind = message[0]
        if kind == "outputs":
            # Progress of requests aborted meanwhile has no state left and is dropped.
            owned, stopped = self._front.process(message[1])
            if stopped:
                self._send(replica, ["finish", stopped])
            self._num_finished[replica.index] += sum(o.finished for o in owned)
            self._outputs.extend(owned)
        elif kind == "add_failed":
            _, request_id, error_type, text = message
            logger.error("replica %d refused request %s: %s: %s", replica.index, request_id, error_type, text)
            if self.router.replica_of(request_id) == replica.index:
                self._num_finished[replica.index] += 1
                self._front.drop(request_id)
                self._outputs.append(failed_output(request_id))
        elif kind == "dead":
            raise self._fail(f"data-parallel replica {replica.index} failed: {message[1]}")
        else:
            replica.replies.append(message)

    def _recv_raw(self, replica: _Replica, timeout: float) -> bytes:
        sentinel = replica.process.sentinel
        ready = wait([replica.conn, *([] if sentinel is None else [sentinel])], timeout=timeout)
        if replica.conn.poll(0):
            try:
                return replica.conn.recv_bytes()
            except (EOFError, OSError):
                pass
        if not ready:
            raise EngineDeadError(f"data-parallel replica {replica.index} did not start within {timeout:.0f} s")
        replica.process.join(1.0)
        raise EngineDeadError(f"data-parallel replica {replica.index} died while starting (exit code {replica.process.exitcode})")

    def _fail(self, reason: str) -> EngineDeadError:
        """A replica is gone: fail every unfinished request, stop the others."""
        if self._dead is None:
            logger.error("data-parallel engine failed: %s", reason)
            error = EngineDeadError(reason)
            error.failed_request_ids = self.router.request_ids()
            for request_id in error.failed_request_ids:
                self.router.remove(request_id)
            self._outputs.clear()
            self._front.clear()
            self._dead = error
            self.shutdown()
        return self._dead

    def _raise_if_dead(self) -> None:
        if self._dead is not None:
            raise self._dead
