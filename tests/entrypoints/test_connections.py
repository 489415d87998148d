"""The connection guard (``GuardedH11Protocol``) on a real uvicorn server with a trivial app
(no model): header and body deadlines, keep-alive, the connection cap (idle connections give
way, busy ones never do; beyond it a fast 503), 431 for an oversized head that the client can
read; and the log's rate limit.

Sockets are read with a timeout a little above the deadline under test: a connection left
open past it fails the test (a bound, not a benchmark).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time

import pytest
import uvicorn

from octavo.entrypoints.openai.connections import ConnectionLimits, guarded_protocol
from octavo.entrypoints.openai.log_limits import RateLimitFilter

HEADER_S = 0.5
BODY_S = 0.5
KEEP_ALIVE_S = 0.5
MAX_CONNECTIONS = 4
MAX_HEAD_BYTES = 4096
SLACK_S = 3.0  # what the reads allow beyond a deadline (scheduling on a loaded machine)


class App:
    """GET: 200 "ok". POST: the body's length. /hold: answers once ``release`` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while scope["method"] == "POST":
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        while scope["path"] == "/hold" and not self.release.is_set():
            await asyncio.sleep(0.01)
        text = b"ok" if scope["method"] == "GET" else str(len(body)).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(len(text)).encode())]})
        await send({"type": "http.response.body", "body": text})


@pytest.fixture
def server():
    app = App()
    limits = ConnectionLimits(header_read_timeout=HEADER_S, body_read_timeout=BODY_S, max_connections=MAX_CONNECTIONS)
    config = uvicorn.Config(
        app, http=guarded_protocol(limits), timeout_keep_alive=KEEP_ALIVE_S, h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        log_level="warning", lifespan="on",
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    yield sock.getsockname(), app
    app.release.set()
    uv.should_exit = True
    thread.join(30)


def connect(address, timeout: float = HEADER_S + SLACK_S) -> socket.socket:
    conn = socket.create_connection(address)
    conn.settimeout(timeout)
    return conn


def read_all(conn: socket.socket) -> bytes:
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    return data


def read_response(conn: socket.socket) -> bytes:
    """One response (head and a Content-Length body) from a kept-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += conn.recv(65536)
    return head + b"\r\n\r\n" + body


def request(method: str, path: str, body: bytes = b"", extra: str = "") -> bytes:
    length = f"Content-Length: {len(body)}\r\n" if method == "POST" else ""
    return f"{method} {path} HTTP/1.1\r\nHost: x\r\n{length}{extra}\r\n".encode() + body


def status_and_json(response: bytes) -> tuple[int, dict]:
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_a_connection_that_sends_nothing_is_closed(server):
    address, _ = server
    assert read_all(connect(address)) == b""


def test_a_head_that_does_not_finish_gets_408(server):
    address, _ = server
    conn = connect(address)
    conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
    status, body = status_and_json(read_all(conn))
    assert status == 408
    assert body["error"]["code"] == "request_timeout" and "headers" in body["error"]["message"]


def test_a_body_that_does_not_finish_gets_408(server):
    address, _ = server
    conn = connect(address, BODY_S + SLACK_S)
    conn.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    status, body = status_and_json(read_all(conn))
    assert status == 408
    # The head was read, so the error takes the route's shape (Anthropic's here).
    assert body == {"type": "error", "error": {"type": "invalid_request_error", "message": f"the request body did not arrive within {BODY_S:g} s"}}


def test_kept_alive_connections_are_closed_when_idle_or_slow(server):
    address, _ = server
    conn = connect(address, KEEP_ALIVE_S + SLACK_S)
    conn.sendall(request("GET", "/"))
    assert read_response(conn).endswith(b"ok")
    assert read_all(conn) == b""  # idle past the keep-alive timeout
    conn = connect(address)
    conn.sendall(request("GET", "/"))
    assert read_response(conn).endswith(b"ok")
    conn.sendall(b"GET / HT")  # the next request's first bytes, then nothing
    assert status_and_json(read_all(conn))[0] == 408


def test_a_full_server_lets_an_idle_connection_go_for_a_new_one(server):
    address, _ = server
    idle = [connect(address) for _ in range(MAX_CONNECTIONS)]
    time.sleep(0.05)  # let the server accept them in order
    newcomer = connect(address)
    newcomer.sendall(request("GET", "/", extra="Connection: close\r\n"))
    assert read_all(newcomer).endswith(b"ok")
    assert read_all(idle[0]) == b""  # the oldest idle one made room


def test_a_full_server_of_busy_connections_refuses_at_once(server):
    address, app = server
    busy = [connect(address) for _ in range(MAX_CONNECTIONS)]
    for conn in busy:
        conn.sendall(request("GET", "/hold"))
    time.sleep(0.2)  # the requests are in, their heads read
    refused = connect(address, SLACK_S)
    status, body = status_and_json(read_all(refused))
    assert status == 503 and body["error"]["code"] == "too_many_connections"
    app.release.set()
    for conn in busy:  # no request in progress was cut for the newcomer
        assert read_response(conn).endswith(b"ok")


def test_an_oversized_head_gets_431_that_the_client_can_read(server):
    address, _ = server
    conn = connect(address)
    # h11 measures a head while it is incomplete: one still arriving past the limit (a big
    # head arrives in many reads; a small one at once is the app's to refuse, with its own 431).
    head = request("GET", "/", extra=f"X-Padding: {'p' * (4 * MAX_HEAD_BYTES)}\r\n")
    conn.sendall(head[:-2])
    status, body = status_and_json(read_all(conn))
    assert status == 431 and body["error"]["code"] == "request_header_fields_too_large"


def test_a_body_within_the_deadline_is_read(server):
    address, _ = server
    conn = connect(address)
    conn.sendall(request("POST", "/", b"x" * 100_000, "Connection: close\r\n"))
    assert read_all(conn).endswith(b"100000")


def test_repeated_messages_are_rate_limited():
    now = [0.0]
    limiter = RateLimitFilter(burst=3, window_s=10.0, clock=lambda: now[0])

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, None, None)

    passed = [limiter.filter(record(f"socket.accept() out of system resource\nsocket: {i}")) for i in range(100)]
    assert passed == [True] * 3 + [False] * 97
    assert limiter.filter(record("another kind"))  # each kind has its own budget
    now[0] = 11.0
    next_one = record("socket.accept() out of system resource\nsocket: 100")
    assert limiter.filter(next_one)
    assert "[97 more like this in the last 10 s were not logged]" in next_one.getMessage()
