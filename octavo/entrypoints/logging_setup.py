"""Log setup for the server and the engine processes it spawns: text (the
default) or one JSON object a line (``--log-format json``), with the id of
the HTTP request a line was logged for.

The request id lives in a context variable that the server's request-id
middleware sets for each request, so every line logged while the request is
handled (uvicorn's access line included) carries it. The chosen level and
format are also put in the environment (``OCTAVO_LOG_LEVEL``,
``OCTAVO_LOG_FORMAT``), so that engine processes log the same way.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from contextvars import ContextVar

LOG_LEVEL_ENV = "OCTAVO_LOG_LEVEL"
LOG_FORMAT_ENV = "OCTAVO_LOG_FORMAT"
LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# The id of the HTTP request being handled (None outside requests), and the
# client's own X-Request-Id when it sent one.
REQUEST_ID: ContextVar[str | None] = ContextVar("octavo_request_id", default=None)
CLIENT_REQUEST_ID: ContextVar[str | None] = ContextVar("octavo_client_request_id", default=None)


def current_request_id() -> str | None:
    return REQUEST_ID.get()


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (UTC, ISO 8601), level, logger, message,
    request_id / client_request_id when logged for a request, pid, exception."""

    def format(self, record: logging.LogRecord) -> str:
        seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        entry = {
            "time": f"{seconds}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        request_id, client_request_id = REQUEST_ID.get(), CLIENT_REQUEST_ID.get()
        if request_id is not None:
            entry["request_id"] = request_id
        if client_request_id is not None:
            entry["client_request_id"] = client_request_id
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: str, log_format: str) -> None:
    """Route every logger (uvicorn's too, if it is not given its own config) to
    stderr in ``log_format``, and tell child processes to do the same."""
    if log_format not in LOG_FORMATS:
        from octavo.errors import InvalidArgumentError

        raise InvalidArgumentError(f"log format must be text or json, got {log_format!r}", param="log_format")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    os.environ.setdefault(LOG_LEVEL_ENV, level.upper())
    os.environ[LOG_FORMAT_ENV] = log_format


def configure_process_logging(default_level: str = "WARNING") -> None:
    """For a spawned engine process: the level and format its parent chose."""
    level = os.environ.get(LOG_LEVEL_ENV, default_level)
    if os.environ.get(LOG_FORMAT_ENV) == "json":
        configure_logging(level, "json")
    else:
        logging.basicConfig(level=level)
