"""Start-up phase timings: each phase of building an engine logs how long it
took (``start-up: <phase> <seconds>s``), so that a slow start can be read from
the log of any front end, and ``benchmarks/startup.py`` can break a server's
start into phases from that log alone."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

logger = logging.getLogger("octavo.startup")


@contextmanager
def timed_phase(name: str) -> Iterator[None]:
    """Log how long the ``with`` body took, as phase ``name`` (also when it raised)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        logger.info("start-up: %s %.2fs", name, time.perf_counter() - started)


def seconds_since_process_start() -> float | None:
    """Wall time since this process started (Linux ``/proc``), or None elsewhere."""
    try:
        with open("/proc/self/stat") as f:
            # Field 22 (starttime, in clock ticks after boot) follows the
            # parenthesised command name, which may itself hold spaces.
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 0.0)


def log_ready(what: str) -> None:
    """One line saying ``what`` is ready and how long after the process started."""
    since_start = seconds_since_process_start()
    if since_start is None:
        logger.info("start-up: %s ready", what)
    else:
        logger.info("start-up: %s ready %.2fs after the process started", what, since_start)
