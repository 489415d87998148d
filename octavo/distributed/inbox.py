"""A connection's incoming messages, read on a thread.

Both ends of a pipe may send at once: the engine a new batch, the worker a
large reply (prompt logprobs of long prompts), or the data-parallel front a
burst of requests while a replica streams outputs. If both sends block on
full buffers, neither side reads and both hang. A worker or replica therefore
reads its pipe on a thread into an unbounded queue: its peer's sends always
complete, so the peer always gets back to reading. An engine process that
serves several fronts (API processes) reads them all into one queue
(``MergedInbox``).
"""

from __future__ import annotations

import functools
import queue
import threading


def _read_into(conn, put) -> None:
    """``put`` every message of ``conn``, then None once the peer has closed."""
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            put(None)
            return
        put(data)


def _put_tagged(sink: queue.SimpleQueue, index: int, data: bytes | None) -> None:
    sink.put((index, data))


class Inbox:
    def __init__(self, conn, name: str = "octavo-inbox") -> None:
        self._conn = conn
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        threading.Thread(target=_read_into, args=(conn, self._queue.put), name=name, daemon=True).start()

    def get(self, block: bool = True) -> bytes | None:
        """The next message; None once the peer has closed. Raises
        ``queue.Empty`` when not blocking and nothing is there."""
        return self._queue.get(block=block)

    def empty(self) -> bool:
        return self._queue.empty()


class MergedInbox:
    """The incoming messages of several connections (one reader thread
    each), in arrival order, as ``(connection index, bytes or None)``; None
    once that peer has closed."""

    def __init__(self, conns: list, name: str = "octavo-inbox") -> None:
        self._queue: queue.SimpleQueue[tuple[int, bytes | None]] = queue.SimpleQueue()
        for index, conn in enumerate(conns):
            put = functools.partial(_put_tagged, self._queue, index)
            threading.Thread(target=_read_into, args=(conn, put), name=f"{name}-{index}", daemon=True).start()

    def get(self) -> tuple[int, bytes | None]:
        return self._queue.get()

    def empty(self) -> bool:
        return self._queue.empty()
