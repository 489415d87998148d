"""Failures the server causes: each one logged with its request's id and
counted in ``/metrics`` as ``octavo:request_failures_total{reason}``.

A failure is a request the server took and then could not serve: answered
with a 5xx, before its first byte or as an error chunk mid-stream. The
reason is the error's code (``engine_dead``, ``request_failed``,
``server_shutting_down``, ...; ``internal_error`` for a bug, logged with its
traceback). Not failures: client errors (4xx), admission refusals under
load (``queue_full``, counted in ``octavo:requests_rejected_total``), and
clients that disconnect (aborts, in ``octavo:request_success_total``).
Each failure gets its own log line on purpose: the counter says how many,
the log says which.
"""

from __future__ import annotations

import logging

from octavo.errors import OctavoError, QueueFullError

logger = logging.getLogger(__name__)


def failure_reason(exc: BaseException) -> str | None:
    """The reason label of a server-caused failure, or None if ``exc`` is not one."""
    from octavo.entrypoints.openai.errors import error_code

    if isinstance(exc, OctavoError):
        if exc.http_status < 500 or isinstance(exc, QueueFullError):
            return None
        return error_code(exc)
    return "internal_error"


def record_failure(metrics, request_id: str | None, exc: BaseException) -> None:
    """Log and count ``exc`` if the server caused it (``metrics``: the app's ``ServerMetrics``)."""
    reason = failure_reason(exc)
    if reason is None:
        return
    metrics.request_failures.labels(reason=reason).inc()
    if isinstance(exc, OctavoError):
        logger.error("request %s failed: %s: %s", request_id, reason, exc.message)
    else:
        logger.error("request %s failed: internal error", request_id, exc_info=exc)
