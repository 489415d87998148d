"""Background responses (``background: true``): generation goes on in a task
of the API process whatever the client does. Without ``stream`` the request
is answered at once with the response ``queued``; the client polls ``GET
/v1/responses/{id}`` (the stored snapshot: ``queued``, then ``completed``,
``incomplete``, ``failed`` or ``cancelled``). With ``stream`` the answer
follows the run's events, and a client that lost them resumes with ``GET
/v1/responses/{id}?stream=true&starting_after=N`` (while the run lasts:
its events are kept until it ends). ``POST /v1/responses/{id}/cancel``
aborts the engine request.

A background response needs the store (``store`` true). The engine's queue
bounds how many run at once: past it, creating one is a 503 like any request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from octavo.entrypoints.async_engine import RequestStream
from octavo.entrypoints.failures import record_failure
from octavo.entrypoints.openai.errors import from_octavo
from octavo.entrypoints.openai.serving import ServingContext, merge_outputs, sse
from octavo.entrypoints.responses_api.builder import ResponseBuilder
from octavo.entrypoints.responses_api.store import ResponseStore
from octavo.errors import InvalidArgumentError, OctavoError

logger = logging.getLogger(__name__)


class BackgroundRun:
    """One background response: its task, and its stream events so far (SSE text, by sequence number)."""

    def __init__(self, builder: ResponseBuilder) -> None:
        self.builder = builder
        self.events: list[str] = []
        self.done = False
        self.changed = asyncio.Event()
        self.task: asyncio.Task | None = None

    def emit(self, events: list[dict]) -> None:
        self.events += [sse(self.builder.numbered(event), event["type"]) for event in events]
        self.changed.set()

    async def follow(self, starting_after: int = -1) -> AsyncIterator[str]:
        """The events after ``starting_after``, then each new one, until the run ends."""
        position = max(starting_after + 1, 0)
        while True:
            while position < len(self.events):
                yield self.events[position]
                position += 1
            if self.done:
                return
            self.changed.clear()
            await self.changed.wait()


class BackgroundRuns:
    """The running background responses of one app, by response id."""

    def __init__(self) -> None:
        self.runs: dict[str, BackgroundRun] = {}

    @property
    def tasks(self) -> list[asyncio.Task]:
        return [run.task for run in self.runs.values() if run.task is not None]

    def start(
        self, ctx: ServingContext, store: ResponseStore, stream: RequestStream, builder: ResponseBuilder,
        items: list[dict],
    ) -> BackgroundRun:
        """Store the queued response and start its task."""
        builder.status = "queued"
        builder.save(store, items)
        run = BackgroundRun(builder)
        run.task = asyncio.get_running_loop().create_task(_generate(ctx, store, stream, run, items))
        self.runs[builder.response_id] = run
        run.task.add_done_callback(lambda _: self.runs.pop(builder.response_id, None))
        return run

    def running(self, store: ResponseStore, response_id: str, action: str, param: str) -> BackgroundRun:
        """The running background response ``response_id`` (404 if unknown, 400 if it is not running)."""
        entry = store.get(response_id)
        run = self.runs.get(response_id)
        if run is None or run.task is None:
            reason = "it is not a background response" if not entry.response.get("background") else "it has finished"
            raise InvalidArgumentError(f"response {response_id!r} cannot be {action}: {reason}", param=param)
        return run

    def following(self, store: ResponseStore, response_id: str) -> BackgroundRun:
        """The running background response to stream again (``GET ...?stream=true``)."""
        return self.running(store, response_id, "streamed (GET it without stream)", "stream")

    async def cancel(self, store: ResponseStore, response_id: str) -> dict:
        """Abort a running background response; its stored snapshot says ``cancelled``."""
        run = self.running(store, response_id, "cancelled", "response_id")
        run.task.cancel()
        await asyncio.gather(run.task, return_exceptions=True)
        return store.get(response_id).response

    async def shutdown(self) -> None:
        tasks = self.tasks
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _generate(ctx: ServingContext, store: ResponseStore, stream: RequestStream, run: BackgroundRun,
                    items: list[dict]) -> None:
    builder = run.builder
    saved = False
    try:
        builder.status = "in_progress"
        run.emit(builder.opening_events())
        async for _, output in merge_outputs(ctx, [stream]):
            events = builder.feed(output)
            if output.finished:  # stored before a follower hears it is done, so that its GET finds it
                events[-1]["response"] = builder.save(store, items)
                saved = True
            run.emit(events)
    except asyncio.CancelledError:
        builder.status = "cancelled"
    except OctavoError as exc:
        record_failure(ctx.metrics, builder.response_id, exc)
        error = from_octavo(exc)
        run.emit([{"type": "error", "code": error.code, "message": error.message, "param": error.param},
                  builder.failed_event(error.code or "server_error", error.message)])
    except Exception as exc:  # a bug: the poller learns the response failed
        logger.exception("background response %s failed", builder.response_id)
        record_failure(ctx.metrics, builder.response_id, exc)
        builder.failed_event("internal_error", f"internal server error: {type(exc).__name__}")
    finally:
        ctx.engine.close(stream)
        if not saved:  # cancelled or failed: the snapshot says so
            builder.save(store, items)
        run.done = True
        run.changed.set()
