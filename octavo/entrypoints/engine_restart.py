"""Rebuilding a failed engine, for ``octavo serve --restart-engine``.

Invariants:

* A restart runs on a thread of its own (loading a model takes seconds):
  the old engine is shut down first (its processes and memory go), then the
  factory builds a new one, which is handed to ``on_ready`` on that thread.
* A factory that raises is retried after a delay that doubles (up to
  ``max_delay_s``); so is a restart that follows the previous one within
  ``stable_after_s`` (an engine that dies at once would otherwise be rebuilt
  in a tight loop).
* After ``stop()`` nothing new is built, and an engine that finishes
  building anyway is shut down instead of handed over; ``stop()`` waits for
  that, so that no engine process outlives the server.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)


@dataclass
class RestartPolicy:
    first_delay_s: float = 0.0
    max_delay_s: float = 30.0
    stable_after_s: float = 60.0


class EngineRestarter:
    def __init__(self, factory: Callable[[], Any], policy: RestartPolicy | None = None) -> None:
        self.factory = factory
        self.policy = policy or RestartPolicy()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._building = False  # from restart() until the new engine is handed over
        self._last_ready: float | None = None
        self._delay = self.policy.first_delay_s

    @property
    def in_progress(self) -> bool:
        return self._building

    def restart(self, old_engine: Any, on_ready: Callable[[Any], None]) -> None:
        """Shut ``old_engine`` down and build a new one in the background; ``on_ready(new)`` gets it.

        Called by the event loop only (no lock needed); a second call while building is ignored."""
        if self._stopped.is_set() or self._building:
            return
        self._building = True
        self._thread = threading.Thread(
            target=self._run, args=(old_engine, on_ready), name="octavo-engine-restart", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Build nothing more; wait for a build in progress (whose engine is then shut down)."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self, old_engine: Any, on_ready: Callable[[Any], None]) -> None:
        try:
            old_engine.shutdown()
        except Exception:  # noqa: BLE001 - a dead engine may fail to stop cleanly; the new one matters
            logger.warning("shutting the failed engine down raised", exc_info=True)
        delay = self._next_delay()
        while not self._stopped.wait(delay):
            logger.warning("restarting the engine")
            try:
                engine = self.factory()
            except Exception:  # noqa: BLE001 - retried: the server stays up, answering 503
                delay = min(max(2 * delay, 1.0), self.policy.max_delay_s)
                logger.exception("the engine did not start; retrying in %.1f s", delay)
                continue
            if self._stopped.is_set():
                engine.shutdown()
                return
            self._last_ready = time.monotonic()
            logger.warning("the engine restarted")
            # Cleared before the handover: the new engine may die (and ask again) at once.
            self._building = False
            on_ready(engine)
            return

    def _next_delay(self) -> float:
        """No wait for a first failure; a doubling one for failures soon after a restart."""
        recent = self._last_ready is not None and time.monotonic() - self._last_ready < self.policy.stable_after_s
        if not recent:
            self._delay = self.policy.first_delay_s
            return self._delay
        self._delay = min(max(2 * self._delay, 1.0), self.policy.max_delay_s)
        return self._delay
