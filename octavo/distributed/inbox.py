"""A connection's incoming messages, read on a thread.

Both ends of a pipe may send at once: the engine a new batch, the worker a
large reply (prompt logprobs of long prompts), or the data-parallel front a
burst of requests while a replica streams outputs. If both sends block on
full buffers, neither side reads and both hang. A worker or replica therefore
reads its pipe on a thread into an unbounded queue: its peer's sends always
complete, so the peer always gets back to reading.
"""

from __future__ import annotations

import queue
import threading


class Inbox:
    def __init__(self, conn, name: str = "octavo-inbox") -> None:
        self._conn = conn
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        threading.Thread(target=self._read, name=name, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = self._conn.recv_bytes()
            except (EOFError, OSError):
                self._queue.put(None)  # the peer is gone
                return
            self._queue.put(data)

    def get(self, block: bool = True) -> bytes | None:
        """The next message; None once the peer has closed. Raises
        ``queue.Empty`` when not blocking and nothing is there."""
        return self._queue.get(block=block)

    def empty(self) -> bool:
        return self._queue.empty()
