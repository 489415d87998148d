"""A connection's outgoing messages, written on a thread.

An engine process streams a message of outputs after every step. If the
peer is slow to read (an API process whose event loop holds its
interpreter lock), a blocking send would stop the engine loop until the
pipe drains: the accelerator then idles while Python elsewhere catches up.
Handing the bytes to a writer thread lets the loop schedule the next step
at once; the write itself releases the interpreter lock.

Every message to the peer goes through the one outbox (replies included),
so they keep their order and never interleave on the pipe. ``flush()``
waits until everything queued so far is written (before a process exits).
"""

from __future__ import annotations

import queue
import threading

_FLUSH = object()


class Outbox:
    def __init__(self, conn, name: str = "octavo-outbox") -> None:
        self._conn = conn
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._broken = False
        self._thread = threading.Thread(target=self._write, name=name, daemon=True)
        self._thread.start()

    def send(self, data: bytes) -> None:
        self._queue.put(data)

    def flush(self, timeout: float | None = 30.0) -> None:
        """Wait until every message queued before this call is written (or the peer is gone)."""
        done = threading.Event()
        self._queue.put((_FLUSH, done))
        done.wait(timeout)

    def _write(self) -> None:
        while True:
            item = self._queue.get()
            if type(item) is tuple and item[0] is _FLUSH:
                item[1].set()
                continue
            if self._broken:
                continue  # the peer is gone: nobody reads; the inbox reports it
            try:
                self._conn.send_bytes(item)
            except OSError:
                self._broken = True
