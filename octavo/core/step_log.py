"""A per-step log of the engine loop (``OCTAVO_STEP_LOG=PATH``).

Finding where a server loses throughput against the offline engine needs
the engine's own view: how many requests each step ran, how many tokens it
computed, how long it took and how long the loop spent between steps
(reading commands, sending outputs, waiting for work). With the variable
set, every engine appends one JSON line per processed batch to
``PATH.<pid>`` (one file per process, so an engine process and an offline
run never interleave): ``t`` (when its outputs were processed,
``time.perf_counter`` seconds), ``dt`` (seconds since the batch before:
the step and the loop's work around it; a long one is the loop waiting for
work), ``reqs`` / ``tokens`` / ``prefill_tokens`` (what it
computed; prefill = tokens of requests with more than one token this step),
``new`` (requests the runner had not seen), ``running`` / ``waiting`` (the
scheduler's queues as the batch is processed). ``benchmarks/step_log_summary.py``
reads the files back. Unset: no observer, no cost. The file is line-buffered (a few dozen
writes a second), so a process killed at the end loses nothing.
"""

from __future__ import annotations

import json
import os
import time

from octavo.core.scheduler_output import SchedulerOutput

ENV = "OCTAVO_STEP_LOG"


class StepLog:
    """An engine's ``step_observer``: one JSON line per processed batch."""

    def __init__(self, path: str, scheduler) -> None:
        self._file = open(f"{path}.{os.getpid()}", "a", buffering=1)  # noqa: SIM115 - lives with the engine
        self._scheduler = scheduler
        self._last = time.perf_counter()

    def __call__(self, scheduled: SchedulerOutput) -> None:
        now = time.perf_counter()
        counts = scheduled.num_scheduled_tokens.values()
        line = {
            "t": round(now, 6),
            "dt": round(now - self._last, 6),
            "reqs": len(scheduled.num_scheduled_tokens),
            "tokens": sum(counts),
            "prefill_tokens": sum(n for n in counts if n > 1),
            "new": len(scheduled.new_requests),
            "running": len(self._scheduler.running),
            "waiting": len(self._scheduler.waiting),
        }
        self._last = now
        self._file.write(json.dumps(line) + "\n")


def step_log_from_env(scheduler) -> StepLog | None:
    path = os.environ.get(ENV)
    return StepLog(path, scheduler) if path else None
