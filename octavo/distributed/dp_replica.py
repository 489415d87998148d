"""One data-parallel replica: a whole engine in its own process.

The replica owns an ``LLMEngine`` (its scheduler, KV cache and prefix cache,
and its own workers when it is tensor/pipeline parallel itself) and serves
the front (``DataParallelEngine``) over a pipe of msgpack messages:

front -> replica: ``["add", id, prompt, params, cache_salt, priority]``,
``["abort", ids]``, ``["stats"]``, ``["health"]``, ``["shutdown"]``.

replica -> front: ``["outputs", [RequestOutput...]]`` after each step that
produced any, ``["stats", SchedulerStats]``, ``["health", error or None]``,
``["add_failed", id, error type, message]``, ``["dead", message]``,
``["bye"]``.

Invariants:
- The replica steps on its own whenever it has work: replicas never wait
  for each other or for the front. Commands are read on a thread (``Inbox``)
  and handled between steps, so a request added while a step runs joins the
  next step, and the front's sends never wait for a step to end.
- The front has validated every request it sends; ``add_failed`` is a
  safety net, not the way bad input is reported: an exception while adding
  one request fails that request only.
- When the front's end of the pipe closes, the replica shuts its engine
  down and exits. It ignores SIGINT: a terminal's Ctrl-C goes to the whole
  process group, and the front decides how to stop.
"""

from __future__ import annotations

import logging
import signal

from octavo.distributed.inbox import Inbox
from octavo.distributed.serialization import decode, encode
from octavo.errors import OctavoError
from octavo.runtime.executors.worker_host import exit_process

logger = logging.getLogger(__name__)


class ReplicaServer:
    def __init__(self, engine, conn) -> None:
        self.engine = engine
        self.conn = conn
        self.inbox = Inbox(conn)

    def serve(self) -> None:
        engine, conn = self.engine, self.conn
        while True:
            # Idle: wait for a command. Busy: take what is there, then step.
            block = not engine.has_unfinished_requests()
            while block or not self.inbox.empty():
                message = self.inbox.get()
                if message is None:  # the front is gone
                    engine.shutdown()
                    return
                if not self.handle(decode(message)):
                    return
                block = False
            if engine.has_unfinished_requests():
                try:
                    outputs = engine.step()
                except BaseException as exc:  # noqa: BLE001 - the front fails this replica's requests
                    logger.error("replica engine failed", exc_info=True)
                    conn.send_bytes(encode(["dead", f"{type(exc).__name__}: {exc}"]))
                    engine.shutdown()
                    exit_process(1)
                if outputs:
                    conn.send_bytes(encode(["outputs", outputs]))

    def handle(self, message: list) -> bool:
        """Run one command; False once the replica should exit."""
        kind = message[0]
        if kind == "add":
            _, request_id, prompt, params, cache_salt, priority = message
            try:
                self.engine.add_request(request_id, prompt, params, cache_salt, priority)
            except OctavoError as exc:
                self.conn.send_bytes(encode(["add_failed", request_id, type(exc).__name__, exc.message]))
            except Exception as exc:  # a bug in adding one request: that request fails, the replica goes on
                logger.exception("replica could not add request %s", request_id)
                self.conn.send_bytes(encode(["add_failed", request_id, type(exc).__name__, str(exc)]))
        elif kind == "abort":
            self.engine.abort_request(message[1])
        elif kind == "stats":
            self.conn.send_bytes(encode(["stats", self.engine.get_stats()]))
        elif kind == "health":
            try:
                self.engine.check_health()
                problem = None
            except OctavoError as exc:
                problem = exc.message
            self.conn.send_bytes(encode(["health", problem]))
        elif kind == "shutdown":
            self.engine.shutdown()
            self.conn.send_bytes(encode(["bye"]))
            return False
        else:
            raise ValueError(f"unknown replica command {kind!r}")
        return True


def run_replica_process(conn, engine_args: bytes) -> None:
    """Entry point of a spawned replica: build the engine, report, serve."""
    # A terminal's Ctrl-C reaches the whole process group; the front decides
    # how to stop (a server drains first) and closes the pipe, which ends us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from octavo.entrypoints.logging_setup import configure_process_logging

    configure_process_logging()  # the server's level and format (OCTAVO_LOG_LEVEL, OCTAVO_LOG_FORMAT)
    from octavo.engine_args import EngineArgs, build_single_engine
    from octavo.runtime.executors.worker_host import encode_error

    try:
        engine = build_single_engine(EngineArgs(**decode(engine_args)))
    except BaseException as exc:  # noqa: BLE001 - reported to the front
        conn.send_bytes(encode_error(exc))
        exit_process(1)
    scheduler = engine.scheduler
    conn.send_bytes(encode(["ok", [engine.limits, engine.info, scheduler.config, scheduler.kv.num_blocks]]))
    ReplicaServer(engine, conn).serve()
    conn.close()
    exit_process(0)
