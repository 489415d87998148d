"""A stand-in OpenAI-compatible server on plain asyncio (no FastAPI, no
Octavo), so ``octavo bench serve`` is shown to work against a server it
knows nothing about.

HTTP/1.1 with keep-alive; ``GET /v1/models``; ``POST /v1/completions`` and
``/v1/chat/completions`` stream ``max_tokens`` one-word chunks, a usage
chunk when asked, and ``[DONE]``. It fails on purpose by prompt: one that
contains ``FAIL-503`` gets a 503, ``FAIL-CHUNK`` an error chunk mid-stream,
``FAIL-DROP`` a connection closed mid-stream. It records every body.
"""

from __future__ import annotations

import asyncio
import json
import threading


class StandInServer:
    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "StandInServer":
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        self._ready.set()
        self._loop.run_forever()
        server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await self._one_request(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _one_request(self, reader, writer) -> bool:
        request_line = await reader.readline()
        if not request_line:
            return False
        method, path, _ = request_line.decode().split(" ", 2)
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", 0)))
        if method == "GET" and path == "/v1/models":
            await _respond(writer, 200, {"object": "list", "data": [{"id": "stand-in", "object": "model"}]})
            return True
        request = json.loads(body)
        self.bodies.append(request)
        prompt = request.get("prompt") or request["messages"][-1]["content"]
        if "FAIL-503" in prompt:
            await _respond(writer, 503, {"error": {"message": "overloaded", "type": "overloaded_error"}})
            return True
        return await self._stream(writer, request, prompt, chat=path.endswith("chat/completions"))

    async def _stream(self, writer, request: dict, prompt: str, chat: bool) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        if chat:
            await _event(writer, {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        num_tokens = request["max_tokens"]
        for index in range(num_tokens):
            if index == 1 and "FAIL-DROP" in prompt:
                writer.close()
                return False
            if index == 1 and "FAIL-CHUNK" in prompt:
                await _event(writer, {"error": {"message": "the engine failed", "code": "internal_error"}})
                break
            finish = "length" if index == num_tokens - 1 else None
            choice = {"index": 0, "delta": {"content": f" w{index}"}} if chat else {"index": 0, "text": f" w{index}"}
            await _event(writer, {"choices": [choice | {"finish_reason": finish}]})
            await asyncio.sleep(0.001)
        if (request.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 1, "completion_tokens": num_tokens, "total_tokens": num_tokens + 1}
            await _event(writer, {"choices": [], "usage": usage})
        await _chunk(writer, b"data: [DONE]\n\n")
        await _chunk(writer, b"")
        return True


async def _chunk(writer, data: bytes) -> None:
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    await writer.drain()


async def _event(writer, payload: dict) -> None:
    await _chunk(writer, f"data: {json.dumps(payload)}\n\n".encode())


async def _respond(writer, status: int, payload: dict) -> None:
    data = json.dumps(payload).encode()
    reason = {200: "OK", 503: "Service Unavailable"}[status]
    head = f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n"
    writer.write(head.encode() + data)
    await writer.drain()
