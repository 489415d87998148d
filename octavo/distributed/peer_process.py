"""A process this one did not start, seen through the little of
``multiprocessing.Process`` that the data-parallel front uses.

With several API processes (``octavo serve --api-server-count N``) the
engine processes are children of the launcher, not of the front that talks
to them; the front still needs to notice one that dies while idle. On Linux
a pidfd becomes readable when the process exits, which makes it a sentinel
like a child's; elsewhere (no ``os.pidfd_open``) there is no sentinel and
the front notices a death when the pipe closes. A peer is never stopped or
joined from here: its launcher owns it.
"""

from __future__ import annotations

import os
import select


class PeerProcess:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.exitcode = None  # not ours to reap
        self._pidfd: int | None = None
        try:
            self._pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            pass

    @property
    def sentinel(self) -> int | None:
        return self._pidfd

    def is_alive(self) -> bool:
        if self._pidfd is None:
            return True  # the pipe tells
        readable, _, _ = select.select([self._pidfd], [], [], 0)
        return not readable

    def join(self, timeout: float | None = None) -> None:
        pass

    def terminate(self) -> None:
        pass

    def kill(self) -> None:
        pass

    def close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
