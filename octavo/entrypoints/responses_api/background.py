"""Background responses (``background: true``): the request is answered at
once with the response ``queued``, and generation goes on in a task of the
API process whatever the client does; the client polls ``GET
/v1/responses/{id}`` (the stored snapshot: ``queued``, then ``completed``,
``incomplete``, ``failed`` or ``cancelled``) and may ``POST
/v1/responses/{id}/cancel``, which aborts the engine request.

A background response needs the store (``store`` true), and is not streamed
(its events are not kept for a later reader). The engine's queue bounds how
many run at once: past it, creating one is a 503 like any request.
"""

from __future__ import annotations

import asyncio
import logging

from octavo.entrypoints.async_engine import RequestStream
from octavo.entrypoints.failures import record_failure
from octavo.entrypoints.openai.errors import from_octavo
from octavo.entrypoints.openai.serving import ServingContext, final_outputs
from octavo.entrypoints.responses_api.builder import ResponseBuilder
from octavo.entrypoints.responses_api.store import ResponseStore
from octavo.errors import InvalidArgumentError, OctavoError

logger = logging.getLogger(__name__)


class BackgroundRuns:
    """The running background responses of one app, by response id."""

    def __init__(self) -> None:
        self.tasks: dict[str, asyncio.Task] = {}
        self.builders: dict[str, ResponseBuilder] = {}

    def start(
        self, ctx: ServingContext, store: ResponseStore, stream: RequestStream, builder: ResponseBuilder,
        items: list[dict],
    ) -> dict:
        """Store the queued response, start its task, and return the response to answer with."""
        builder.status = "queued"
        response = builder.save(store, items)
        task = asyncio.get_running_loop().create_task(self._run(ctx, store, stream, builder, items))
        self.tasks[builder.response_id] = task
        self.builders[builder.response_id] = builder
        task.add_done_callback(lambda _: self._forget(builder.response_id))
        return response

    async def cancel(self, store: ResponseStore, response_id: str) -> dict:
        """Abort a running background response; its stored snapshot says ``cancelled``."""
        entry = store.get(response_id)
        task = self.tasks.get(response_id)
        if task is None:
            reason = "it is not a background response" if not entry.response.get("background") else "it has finished"
            raise InvalidArgumentError(f"response {response_id!r} cannot be cancelled: {reason}", param="response_id")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return store.get(response_id).response

    async def shutdown(self) -> None:
        for task in list(self.tasks.values()):
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)

    def _forget(self, response_id: str) -> None:
        self.tasks.pop(response_id, None)
        self.builders.pop(response_id, None)

    @staticmethod
    async def _run(
        ctx: ServingContext, store: ResponseStore, stream: RequestStream, builder: ResponseBuilder, items: list[dict],
    ) -> None:
        try:
            finals = await final_outputs(ctx, [stream])
            builder.feed(finals[0])
        except asyncio.CancelledError:
            builder.status = "cancelled"
        except OctavoError as exc:
            record_failure(ctx.metrics, builder.response_id, exc)
            error = from_octavo(exc)
            builder.failed_event(error.code or "server_error", error.message)
        except Exception as exc:  # a bug: the poller learns the response failed
            logger.exception("background response %s failed", builder.response_id)
            record_failure(ctx.metrics, builder.response_id, exc)
            builder.failed_event("internal_error", f"internal server error: {type(exc).__name__}")
        finally:
            ctx.engine.close(stream)
            builder.save(store, items)
