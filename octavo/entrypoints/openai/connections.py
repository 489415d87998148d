"""Connection hygiene for ``octavo serve``: what uvicorn's HTTP/1.1 protocol (h11)
lacks, added in a subclass of it.

uvicorn closes a kept-alive connection after ``timeout_keep_alive`` seconds
of silence between requests, and h11 refuses a request head larger than
``h11_max_incomplete_event_size``; but a connection that sends nothing, or a
byte every few seconds, stays open for ever, and a refused head is answered
by closing the socket under the client (a reset instead of a status). Here:

* **Header deadline**: a request's head (request line and headers) must be
  complete ``header_read_timeout`` seconds after the connection opened, or,
  on a kept-alive connection, after the request's first byte. A connection
  that sent nothing is then closed; one that sent part of a head gets 408.
* **Body deadline**: the body must be complete ``body_read_timeout`` seconds
  after the head; if not, 408 and the connection closes (the app sees a
  disconnect). The time the app takes to answer is not limited here.
* **Connection cap**: at most ``max_connections`` connections are open. A
  new one beyond it takes the place of the oldest connection that is only
  waiting for a request head (idle, or trickling its headers), which is
  closed; if every connection is busy with a request, the new one gets 503
  at once and is closed. So idle sockets can never lock clients out, and no
  request in progress is ever cut for a newcomer.
* **Oversized heads** get 431 (other malformed requests 400) as a JSON
  error in the API's shape, and the connection lingers ``LINGER_S`` reading
  and dropping what the client still sends, so that the client reads the
  answer instead of a reset.

Each server gets its own protocol class (``guarded_protocol``), carrying
its limits and its set of connections waiting for a head.
"""

from __future__ import annotations

import asyncio
import http
import json
import logging
import resource
from dataclasses import dataclass
from typing import ClassVar

import h11
from h11._connection import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
from uvicorn.protocols.http.h11_impl import H11Protocol

from octavo.entrypoints.openai.errors import ApiError, error_body

logger = logging.getLogger(__name__)

LINGER_S = 1.0
# File descriptors kept for everything but client connections (model files,
# engine pipes, the listening socket, logs).
FD_RESERVE = 128


@dataclass(frozen=True)
class ConnectionLimits:
    header_read_timeout: float = 10.0
    body_read_timeout: float = 60.0
    max_connections: int = 2048


class WaitingConnections:
    """Connections waiting for a request head, oldest first: the ones to let go when full."""

    def __init__(self) -> None:
        self._order: dict[H11Protocol, None] = {}

    def add(self, protocol: H11Protocol) -> None:
        self._order.pop(protocol, None)
        self._order[protocol] = None

    def discard(self, protocol: H11Protocol) -> None:
        self._order.pop(protocol, None)

    def oldest(self) -> H11Protocol | None:
        return next(iter(self._order), None)

    def __len__(self) -> int:
        return len(self._order)


class _RecordingConnection(h11.Connection):
    """h11's connection, remembering why it refused a request (uvicorn drops the reason)."""

    last_error: h11.RemoteProtocolError | None = None

    def next_event(self):
        try:
            return super().next_event()
        except h11.RemoteProtocolError as exc:
            self.last_error = exc
            raise


class GuardedH11Protocol(H11Protocol):
    limits: ClassVar[ConnectionLimits]
    waiting: ClassVar[WaitingConnections]

    def __init__(self, config, server_state, app_state, _loop=None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.max_head_bytes = config.h11_max_incomplete_event_size or DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
        self.conn = _RecordingConnection(h11.SERVER, self.max_head_bytes)
        self._deadline: asyncio.TimerHandle | None = None
        self._awaiting: str | None = None  # "head" or "body": what the deadline waits for
        self._head_started = False
        self._answered = False  # we answered on our own and are closing

    # ---------------------------------------------------------------- events

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections and not self._make_room():
            logger.warning("refused a connection: all %d are busy with requests", self.limits.max_connections)
            self._answer(503, "the server has too many connections open; retry later", "too_many_connections")
            return
        self._expect_head(started=False)

    def data_received(self, data: bytes) -> None:
        if self._answered:
            return  # lingering: drop what the client still sends
        if self._awaiting is None and self.conn.their_state is h11.IDLE:
            self._expect_head(started=True)  # the first byte of the next request on a kept-alive connection
        self._head_started = True
        super().data_received(data)
        self._follow_state()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self.waiting.add(self)  # idle between requests: uvicorn's keep-alive timer runs
        self._follow_state()

    def connection_lost(self, exc) -> None:
        self._disarm()
        self.waiting.discard(self)
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        error = self.conn.last_error
        if error is not None and error.error_status_hint == 431:
            message = f"the request head is larger than {self.max_head_bytes} bytes"
            self._answer(431, message, "request_header_fields_too_large", linger=True)
        else:
            self._answer(400, f"invalid HTTP request: {error or msg}", "invalid_http_request", linger=True)

    # ------------------------------------------------------------- deadlines

    def _expect_head(self, started: bool) -> None:
        self._head_started = started
        self.waiting.add(self)
        self._arm("head", self.limits.header_read_timeout)

    def _follow_state(self) -> None:
        """After h11 has read what arrived: move the deadline to what is awaited now."""
        if self._answered:
            return
        state = self.conn.their_state
        if state is h11.IDLE:
            return  # a head (or the next request's first byte) is still awaited
        self.waiting.discard(self)
        if state is h11.SEND_BODY:
            if self._awaiting != "body":
                self._arm("body", self.limits.body_read_timeout)
        else:  # the request is in; answering it takes as long as it takes
            self._disarm()

    def _arm(self, awaiting: str, timeout: float) -> None:
        self._disarm()
        self._awaiting = awaiting
        self._deadline = self.loop.call_later(timeout, self._on_deadline)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._awaiting = None

    def _on_deadline(self) -> None:
        awaiting, self._deadline = self._awaiting, None
        self._awaiting = None
        if self._answered or self.transport.is_closing():
            return
        if awaiting == "head" and not self._head_started:
            self._close_quietly()  # nothing was sent: nobody to answer
        elif awaiting == "head":
            limit = self.limits.header_read_timeout
            self._answer(408, f"the request headers did not arrive within {limit:g} s", "request_timeout")
        else:
            limit = self.limits.body_read_timeout
            message = f"the request body did not arrive within {limit:g} s"
            self._answer(408, message, "request_timeout", path=self.scope["path"])

    # ------------------------------------------------------------- closing

    def _make_room(self) -> bool:
        """Close the oldest connection that only waits for a head; False if there is none."""
        victim = self.waiting.oldest()
        if victim is None or victim is self:
            return False
        victim._close_quietly()
        return True

    def _close_quietly(self) -> None:
        self._answered = True
        self._disarm()
        self.waiting.discard(self)
        self.transport.close()

    def _answer(self, status: int, message: str, code: str, linger: bool = False, path: str = "") -> None:
        """Answer ``status`` outside the app (and outside h11's state machine), then close.

        ``path`` picks the error's shape (Anthropic's on its routes); "" when no head was read."""
        self._answered = True
        self._disarm()
        self.waiting.discard(self)
        body = json.dumps(error_body(path, ApiError(status, message, code=code))).encode()
        phrase = http.HTTPStatus(status).phrase
        head = (
            f"HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        self.transport.write(head.encode() + body)
        if linger and self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedH11Protocol]:
    """A protocol class for one server (pass it to uvicorn as ``http=``)."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits, "waiting": WaitingConnections()})


def fit_to_fd_limit(max_connections: int) -> int:
    """Raise the soft file-descriptor limit as far as needed (up to the hard one);
    the connection cap that fits under it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max_connections + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return max_connections
    fitted = max(1, soft - FD_RESERVE)
    logger.warning(
        "the file-descriptor limit (%d) leaves room for %d connections, not %d: capping there", soft, fitted, max_connections
    )
    return fitted
