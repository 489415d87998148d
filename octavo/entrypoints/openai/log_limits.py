"""Rate-limited logging for the messages a misbehaving client can repeat at will
(connection errors, refused connections, invalid HTTP, per-request failures),
so that a flood of them cannot flood the log (or the disk) with tracebacks.

A record's kind is its logger and the first line of its message template
(asyncio puts the details, e.g. a socket's repr, on later lines). Each kind
gets ``burst`` records per ``window_s``; the rest are counted, and the next
record of that kind let through says how many were dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

# The loggers that carry such messages; never the access log (one line per request, by design).
RATE_LIMITED_LOGGERS = (
    "asyncio",
    "uvicorn.error",
    "octavo.entrypoints.openai.connections",
    "octavo.entrypoints.async_engine",
    "octavo.core.engine",
)
MAX_KINDS = 1024


@dataclass
class _Window:
    start: float
    num_logged: int = 0
    num_dropped: int = 0


class RateLimitFilter(logging.Filter):
    def __init__(self, burst: int = 10, window_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.burst = burst
        self.window_s = window_s
        self.clock = clock
        self._windows: dict[tuple[str, str], _Window] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        kind = (record.name, str(record.msg).split("\n", 1)[0][:120])
        now = self.clock()
        with self._lock:
            window = self._windows.get(kind)
            if window is None or now - window.start >= self.window_s:
                num_dropped = window.num_dropped if window is not None else 0
                if window is None and len(self._windows) >= MAX_KINDS:
                    self._forget_old(now)
                window = self._windows[kind] = _Window(now)
                if num_dropped:
                    record.msg = f"{record.msg} [{num_dropped} more like this in the last {self.window_s:g} s were not logged]"
            if window.num_logged >= self.burst:
                window.num_dropped += 1
                return False
            window.num_logged += 1
        return True

    def _forget_old(self, now: float) -> None:
        self._windows = {k: w for k, w in self._windows.items() if now - w.start < self.window_s}


def install_rate_limits(names: Iterable[str] = RATE_LIMITED_LOGGERS, **options) -> RateLimitFilter:
    """Put one shared filter on each named logger (call after logging is configured)."""
    limiter = RateLimitFilter(**options)
    for name in names:
        logging.getLogger(name).addFilter(limiter)
    return limiter
