"""``octavo chat`` and ``octavo complete``: talk to a running OpenAI-compatible
server from the terminal (vLLM's ``vllm chat`` / ``vllm complete``).

Interactive by default: each line read is a user message (chat keeps the
conversation) or a prompt (complete), and the answer streams back; end of
input quits. ``-q TEXT`` sends one message and exits. The model is
``--model-name``, or the first the server lists; the key is ``--api-key``,
``$OCTAVO_API_KEY`` or ``$OPENAI_API_KEY``. An error answer is printed with
the server's message and the command exits with status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8000/v1"


def add_parser(sub: argparse._SubParsersAction) -> None:
    for name, help_text in (("chat", "chat with a running server (streamed)"),
                            ("complete", "complete prompts with a running server (streamed)")):
        parser = sub.add_parser(name, help=help_text)
        parser.add_argument("--url", default=DEFAULT_URL, help=f"the server's OpenAI base URL (default {DEFAULT_URL})")
        parser.add_argument("--model-name", default=None, help="the model (default: the first the server lists)")
        parser.add_argument("--api-key", default=None, help="the server's key (also $OCTAVO_API_KEY, $OPENAI_API_KEY)")
        parser.add_argument("--max-tokens", type=int, default=None, help="tokens per answer (default: the server's)")
        parser.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: the model's)")
        parser.add_argument("-q", "--quick", default=None, metavar="TEXT", help="send TEXT, print the answer, exit")
        if name == "chat":
            parser.add_argument("--system-prompt", default=None, help="a system message before the conversation")
        parser.set_defaults(func=run, client_mode=name)


def run(args: argparse.Namespace) -> int:
    try:
        import httpx
    except ImportError:
        print("error: octavo chat / complete need httpx: pip install 'octavo[serve]'", file=sys.stderr)
        return 2

    key = args.api_key or os.environ.get("OCTAVO_API_KEY") or os.environ.get("OPENAI_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with httpx.Client(base_url=args.url.rstrip("/"), headers=headers, timeout=httpx.Timeout(600, connect=10)) as client:
        try:
            model = args.model_name or _first_model(client)
            session = Session(client, model, args)
            lines = [args.quick] if args.quick is not None else _read_lines()
            for line in lines:
                session.send(line)
        except ClientError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except httpx.HTTPError as exc:
            print(f"error: cannot reach {args.url}: {exc}", file=sys.stderr)
            return 1
    return 0


class ClientError(Exception):
    """The server answered with an error."""


class Session:
    def __init__(self, client: Any, model: str, args: argparse.Namespace) -> None:
        self.client = client
        self.model = model
        self.chat = args.client_mode == "chat"
        self.messages: list[dict] = []
        if self.chat and args.system_prompt:
            self.messages.append({"role": "system", "content": args.system_prompt})
        self.options = {k: v for k, v in (("max_tokens", args.max_tokens), ("temperature", args.temperature)) if v is not None}

    def send(self, text: str) -> str:
        if self.chat:
            self.messages.append({"role": "user", "content": text})
            body = {"model": self.model, "messages": self.messages, "stream": True, **self.options}
            answer = self._stream("/chat/completions", body, lambda choice: choice["delta"].get("content"))
            self.messages.append({"role": "assistant", "content": answer})
        else:
            body = {"model": self.model, "prompt": text, "stream": True, **self.options}
            answer = self._stream("/completions", body, lambda choice: choice.get("text"))
        return answer

    def _stream(self, path: str, body: dict, piece_of) -> str:
        pieces = []
        for chunk in _events(self.client, path, body):
            for choice in chunk.get("choices", []):
                piece = piece_of(choice) or ""
                pieces.append(piece)
                print(piece, end="", flush=True)
        print(flush=True)
        return "".join(pieces)


def _events(client: Any, path: str, body: dict) -> Iterator[dict]:
    with client.stream("POST", path, json=body) as response:
        if response.status_code >= 400:
            response.read()
            raise ClientError(_error_message(response))
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                return
            chunk = json.loads(data)
            if "error" in chunk:  # a failure mid-stream
                raise ClientError(chunk["error"].get("message", "the server failed"))
            yield chunk


def _first_model(client: Any) -> str:
    response = client.get("/models")
    if response.status_code >= 400:
        raise ClientError(_error_message(response))
    models = response.json().get("data") or []
    if not models:
        raise ClientError("the server lists no model")
    return models[0]["id"]


def _error_message(response: Any) -> str:
    try:
        return f"{response.status_code}: {response.json()['error']['message']}"
    except (ValueError, KeyError, TypeError):
        return f"{response.status_code}: {response.text[:200]}"


def _read_lines() -> Iterator[str]:
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print("> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line:
            return
        if line.strip():
            yield line.rstrip("\n")
