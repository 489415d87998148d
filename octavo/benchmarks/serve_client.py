"""One streamed request to an OpenAI-compatible server, timed (``octavo bench serve``).

Works against any server that speaks the OpenAI API: ``/v1/completions``
(``prompt``) or ``/v1/chat/completions`` (one user message), ``stream`` with
``stream_options.include_usage`` so that the output token count is the
server's own (else the tokenizer counts the text). The first chunk that
carries output (text, or a token with no text yet) sets the time to first
token; each later one adds an inter-token latency sample, so a chunk that
carries several tokens counts as one gap (as vLLM's client counts it).

A request fails on a non-200 status, an error chunk in the stream, a
transport error or a stream that ends without ``[DONE]``; the failure keeps
its error text.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from octavo.benchmarks.serve_datasets import SampleRequest

if TYPE_CHECKING:  # httpx comes with the serve extra; the CLI imports this module to build its parser
    import httpx


@dataclass
class RequestSettings:
    """What every request of a run sends besides its prompt."""

    endpoint: str
    model: str
    temperature: float = 0.0
    ignore_eos: bool = False
    extra_body: dict = field(default_factory=dict)

    @property
    def is_chat(self) -> bool:
        return self.endpoint.rstrip("/").endswith("chat/completions")


@dataclass
class RequestResult:
    prompt_len: int
    success: bool = False
    ttft_s: float = 0.0
    latency_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    output_tokens: int = 0  # from the server's usage, else counted
    generated_text: str = ""
    error: str = ""
    started_at: float = 0.0


def request_body(settings: RequestSettings, sample: SampleRequest) -> dict:
    body = {
        "model": settings.model,
        "max_tokens": sample.expected_output_len,
        "temperature": settings.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if settings.ignore_eos:
        body["ignore_eos"] = True
    if settings.is_chat:
        body["messages"] = [{"role": "user", "content": sample.prompt}]
    else:
        body["prompt"] = sample.prompt
    body.update(settings.extra_body)
    return body


async def send_request(client: httpx.AsyncClient, settings: RequestSettings, sample: SampleRequest) -> RequestResult:
    import httpx

    result = RequestResult(prompt_len=sample.prompt_len, started_at=time.perf_counter())
    try:
        async with client.stream("POST", settings.endpoint, json=request_body(settings, sample)) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                result.error = f"HTTP {response.status_code}: {body[:300]}"
                return result
            await _read_stream(response, settings.is_chat, result)
    except httpx.HTTPError as exc:
        result.error = f"{type(exc).__name__}: {exc}".rstrip(": ")
    return result


async def _read_stream(response: httpx.Response, is_chat: bool, result: RequestResult) -> None:
    last = result.started_at
    texts: list[str] = []
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            result.latency_s = time.perf_counter() - result.started_at
            result.generated_text = "".join(texts)
            result.success = not result.error
            return
        chunk = json.loads(data)
        if "error" in chunk:
            error = chunk["error"]
            result.error = error.get("message", str(error)) if isinstance(error, dict) else str(error)
            continue
        usage = chunk.get("usage")
        if usage and usage.get("completion_tokens") is not None:
            result.output_tokens = usage["completion_tokens"]
        choices = chunk.get("choices") or []
        if not choices or not _carries_output(choices, is_chat):
            continue
        now = time.perf_counter()
        if not result.ttft_s:
            result.ttft_s = now - result.started_at
        else:
            result.itl_s.append(now - last)
        last = now
        texts.extend(_text(choice, is_chat) for choice in choices)
    result.error = result.error or "the stream ended without [DONE]"


def _carries_output(choices: list[dict], is_chat: bool) -> bool:
    if not is_chat:
        return any(c.get("text") or c.get("finish_reason") is None for c in choices)
    # Chat: not the opening role chunk, not a content-less final chunk.
    return any((c.get("delta") or {}).get("content") for c in choices)


def _text(choice: dict, is_chat: bool) -> str:
    if is_chat:
        return (choice.get("delta") or {}).get("content") or ""
    return choice.get("text") or ""
