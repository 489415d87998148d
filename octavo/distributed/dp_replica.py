"""One data-parallel replica: a whole engine in its own process.

The replica owns an ``LLMEngine`` (its scheduler, KV cache and prefix cache,
and its own workers when it is tensor/pipeline parallel itself) and serves
its fronts (a ``DataParallelEngine`` in each API process; one unless
``octavo serve --api-server-count N``) over pipes of msgpack messages:

front -> replica: ``["add", id, prompt, params, cache_salt, priority, lora_request]``,
``["add_pooling", ids, texts, token ids, segment ids, params]`` (many
pooling inputs, ``dp_pooling``),
``["abort", ids]``, ``["finish", child ids]`` (stop strings the front
found), ``["stats"]``, ``["reset_prefix_cache"]``, ``["health"]``, ``["shutdown"]``.

replica -> front: ``["outputs", rows]`` after each step that produced any
for that front: the engine's per-child progress (an ``EngineCore``: token
ids, no text; the front detokenizes), packed by ``output_codec``,
``["stats", SchedulerStats]``, ``["health", error or None]``,
``["add_failed", id, error type, message]``, ``["dead", message]``,
``["bye"]``.

Invariants:
- The replica steps on its own whenever it has work: replicas never wait
  for each other or for a front. Commands are read on threads
  (``MergedInbox``) and handled between steps, so a request added while a
  step runs joins the next step, and a front's sends never wait for a step
  to end. Messages to a front are written on a thread (``Outbox``), so a
  front that is slow to read never holds up the next step.
- A request (and its children) belongs to the front that added it: its
  outputs go to that front only, a front can abort or finish only its own,
  and when a front leaves (``shutdown`` or its pipe closes) its requests are
  aborted. The engine shuts down when the last front has
  left.
- The front has validated every request it sends; ``add_failed`` is a
  safety net, not the way bad input is reported: an exception while adding
  one request fails that request only.
- It ignores SIGINT: a terminal's Ctrl-C goes to the whole process group,
  and the front decides how to stop.
"""

from __future__ import annotations

import logging
import signal

from octavo.core.pooling_batch import PoolingBatch
from octavo.core.request import RequestStatus
from octavo.distributed.inbox import MergedInbox
from octavo.distributed.outbox import Outbox
from octavo.distributed.output_codec import pack_outputs
from octavo.distributed.serialization import decode, encode
from octavo.errors import OctavoError
from octavo.runtime.executors.worker_host import exit_process

logger = logging.getLogger(__name__)


class ReplicaServer:
    def __init__(self, engine, conns: list) -> None:
        self.engine = engine
        self.inbox = MergedInbox(conns)
        self.outboxes = [Outbox(conn, name=f"octavo-outbox-{i}") for i, conn in enumerate(conns)]
        self.live_fronts = set(range(len(conns)))
        # Which front added each unfinished child request (its outputs go there).
        self.owner: dict[str, int] = {}

    def serve(self) -> None:
        engine = self.engine
        while True:
            # Idle: wait for a command. Busy: take what is there, then step.
            block = not engine.has_unfinished_requests()
            while block or not self.inbox.empty():
                front, message = self.inbox.get()
                left = message is None or not self.handle(front, decode(message))
                if left:
                    self._leave(front)
                    if not self.live_fronts:
                        engine.shutdown()
                        return
                block = False
            if engine.has_unfinished_requests():
                try:
                    outputs = engine.step()
                except BaseException as exc:  # noqa: BLE001 - the fronts fail this replica's requests
                    logger.error("replica engine failed", exc_info=True)
                    self._send_all(["dead", f"{type(exc).__name__}: {exc}"])
                    engine.shutdown()
                    exit_process(1)
                if outputs:
                    self._send_outputs(outputs)

    def _send_outputs(self, outputs: list) -> None:
        by_front: dict[int, list] = {}
        for output in outputs:
            front = self.owner.get(output.request_id)
            if front is None:
                continue  # its front left meanwhile
            if output.finished:
                del self.owner[output.request_id]
            by_front.setdefault(front, []).append(output)
        for front, owned in by_front.items():
            self.outboxes[front].send(encode(["outputs", pack_outputs(owned)]))

    def _send_all(self, message: list) -> None:
        data = encode(message)
        for front in self.live_fronts:
            self.outboxes[front].send(data)
        for front in self.live_fronts:
            self.outboxes[front].flush()

    def _leave(self, front: int) -> None:
        """A front is gone (or said goodbye): abort what it added."""
        self.live_fronts.discard(front)
        self._finish(front, [r for r, owner in self.owner.items() if owner == front], RequestStatus.FINISHED_ABORTED)

    def _finish(self, front: int, child_ids: list[str], status: RequestStatus) -> None:
        owned = [c for c in child_ids if self.owner.get(c) == front]
        for child_id in owned:
            del self.owner[child_id]
        if owned:
            self.engine.finish_children(owned, status)

    def _add(self, front: int, request_ids: list[str], add) -> None:
        """Run ``add()``, which adds ``request_ids``; on an error each is reported
        failed to ``front`` (a bug is logged too) and the replica goes on."""
        try:
            add()
        except Exception as exc:  # the front checked them: a safety net
            if not isinstance(exc, OctavoError):
                logger.exception("replica could not add request %s", ", ".join(request_ids[:3]))
            text = exc.message if isinstance(exc, OctavoError) else str(exc)
            for request_id in request_ids:
                self.outboxes[front].send(encode(["add_failed", request_id, type(exc).__name__, text]))
            return
        self.owner.update((child_id, front) for request_id in request_ids
                          for child_id in self.engine.children_of(request_id))

    def _add_pooling(self, front: int, request_ids, texts, token_ids, token_type_ids, params) -> None:
        """Many pooling inputs (``dp_pooling``): all added or, on an error, each reported failed."""
        batch = PoolingBatch(request_ids, texts, token_ids, token_type_ids)
        self._add(front, request_ids, lambda: self.engine.add_pooling_requests(batch, params))

    def handle(self, front: int, message: list) -> bool:
        """Run one command of ``front``; False once that front leaves."""
        kind, reply = message[0], self.outboxes[front].send
        if kind == "add":
            _, request_id, prompt, params, cache_salt, priority, lora = message
            self._add(
                front, [request_id], lambda: self.engine.add_request(request_id, prompt, params, cache_salt, priority, lora)
            )
        elif kind == "add_pooling":
            self._add_pooling(front, *message[1:])
        elif kind == "abort":
            child_ids = [c for r in message[1] for c in self.engine.children_of(r)]
            self._finish(front, child_ids, RequestStatus.FINISHED_ABORTED)
        elif kind == "finish":
            self._finish(front, message[1], RequestStatus.FINISHED_STOPPED)
        elif kind == "stats":
            reply(encode(["stats", self.engine.get_stats()]))
        elif kind == "reset_prefix_cache":
            reply(encode(["reset_prefix_cache", self.engine.reset_prefix_cache()]))
        elif kind == "health":
            try:
                self.engine.check_health()
                problem = None
            except OctavoError as exc:
                problem = exc.message
            reply(encode(["health", problem]))
        elif kind == "shutdown":
            reply(encode(["bye"]))
            self.outboxes[front].flush()
            return False
        else:
            raise ValueError(f"unknown replica command {kind!r}")
        return True


def run_replica_process(conns: list, engine_args: bytes) -> None:
    """Entry point of a spawned replica: build the engine, report to every
    front (``conns``: one pipe end per front), serve."""
    # A terminal's Ctrl-C reaches the whole process group; the fronts decide
    # how to stop (a server drains first) and close their pipes, which ends us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from octavo.entrypoints.logging_setup import configure_process_logging

    configure_process_logging()  # the server's level and format (OCTAVO_LOG_LEVEL, OCTAVO_LOG_FORMAT)
    from octavo.core.engine_core import EngineCore
    from octavo.engine_args import EngineArgs, build_single_engine
    from octavo.runtime.executors.worker_host import encode_error

    try:
        engine = build_single_engine(EngineArgs(**decode(engine_args)), engine_cls=EngineCore)
    except BaseException as exc:  # noqa: BLE001 - reported to the fronts
        for conn in conns:
            conn.send_bytes(encode_error(exc))
        exit_process(1)
    scheduler = engine.scheduler
    hello = encode(["ok", [engine.limits, engine.info, scheduler.config, scheduler.kv.num_blocks]])
    for conn in conns:
        conn.send_bytes(hello)
    ReplicaServer(engine, conns).serve()
    for conn in conns:
        conn.close()
    exit_process(0)
