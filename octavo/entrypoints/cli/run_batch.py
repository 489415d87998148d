"""``octavo run-batch -i requests.jsonl -o results.jsonl MODEL``: OpenAI's batch
file format run offline (vLLM's ``vllm run-batch``).

Each input line is ``{"custom_id", "method": "POST", "url", "body"}`` with a
``url`` among ``BATCH_URLS``; each output line (in input order) is
``{"id", "custom_id", "response": {"status_code", "request_id", "body"},
"error"}``. The bodies go through the server's own routes, in this process
and without a socket, so their fields, checks and answers are exactly the
server's (a request the server would refuse gets its 4xx in ``response``).
A line that is not a request at all (bad JSON, no ``custom_id``, another
``url`` or method, ``stream: true``) gets ``error`` and no ``response``.
Requests run concurrently, ``--max-concurrency`` at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from pathlib import Path
from typing import Any

BATCH_URLS = frozenset({
    "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings", "/v1/score", "/v1/rerank",
    "/score", "/rerank", "/classify",
})


def add_parser(sub: argparse._SubParsersAction) -> None:
    from octavo.entrypoints.cli.common import add_engine_args

    parser = sub.add_parser("run-batch", help="run a file of OpenAI batch requests offline (vLLM's run-batch)")
    add_engine_args(parser, model_positional=True)
    parser.add_argument("-i", "--input-file", required=True, help="the requests, one JSON object a line")
    parser.add_argument("-o", "--output-file", required=True, help="where the results go, one JSON object a line")
    parser.add_argument("--served-model-name", nargs="+", default=None, help="the names the bodies' model may use")
    parser.add_argument("--max-concurrency", type=int, default=256, help="requests in flight at once")
    parser.set_defaults(func=run, engine_process=False)


def run(args: argparse.Namespace) -> int:
    from octavo.errors import OctavoError

    try:
        import fastapi  # noqa: F401
        import httpx  # noqa: F401
    except ImportError as exc:
        raise OctavoError(f"octavo run-batch needs the serve extra ({exc.name} is missing): pip install 'octavo[serve]'")
    from octavo.default_model import DEFAULT_MODEL_NAME
    from octavo.entrypoints.cli.serve import start_engine
    from octavo.entrypoints.openai.app import build_app
    from octavo.entrypoints.openai.config import ServerConfig
    from octavo.entrypoints.openai.operations import RequestIdMiddleware
    from octavo.errors import InvalidArgumentError

    if args.max_concurrency < 1:
        raise InvalidArgumentError("--max-concurrency must be at least 1", param="max_concurrency")
    lines = Path(args.input_file).read_text().splitlines()
    names = args.served_model_name or [args.model or DEFAULT_MODEL_NAME]
    engine = start_engine(args)
    try:
        app = build_app(engine, ServerConfig(served_model_names=names, enable_ui=False))
        app.add_middleware(RequestIdMiddleware)  # each result's request_id, as the server's X-Request-Id
        results = asyncio.run(run_lines(app, [line for line in lines if line.strip()], args.max_concurrency))
    finally:
        engine.shutdown()
    Path(args.output_file).write_text("".join(json.dumps(result) + "\n" for result in results))
    failed = sum(1 for r in results if r["error"] or r["response"]["status_code"] >= 400)
    print(f"{len(results)} requests, {failed} failed: {args.output_file}", file=sys.stderr)
    return 0


async def run_lines(app: Any, lines: list[str], max_concurrency: int) -> list[dict]:
    """Each line's result, in order, the app's lifespan (its engine loop) running around them."""
    import httpx

    gate = asyncio.Semaphore(max_concurrency)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://batch", timeout=None) as client:
            async def one(line: str) -> dict:
                async with gate:
                    return await run_line(client, line)

            return list(await asyncio.gather(*(one(line) for line in lines)))


async def run_line(client: Any, line: str) -> dict:
    result: dict[str, Any] = {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": None, "response": None, "error": None}
    try:
        request = json.loads(line)
        if isinstance(request, dict) and isinstance(request.get("custom_id"), str):
            result["custom_id"] = request["custom_id"]
        check_request(request)
    except ValueError as exc:
        result["error"] = {"code": "invalid_request", "message": str(exc)}
        return result
    response = await client.post(request["url"], json=request["body"])
    result["response"] = {
        "status_code": response.status_code,
        "request_id": response.headers.get("x-request-id"),
        "body": response.json(),
    }
    return result


def check_request(request: Any) -> None:
    """``ValueError`` saying what is wrong with a request line (its JSON)."""
    if not isinstance(request, dict) or not isinstance(request.get("custom_id"), str):
        raise ValueError("a request line is an object with a custom_id string")
    if request.get("method", "POST") != "POST":
        raise ValueError(f"method must be POST, got {request.get('method')!r}")
    if request.get("url") not in BATCH_URLS:
        raise ValueError(f"url must be one of {', '.join(sorted(BATCH_URLS))}, got {request.get('url')!r}")
    if not isinstance(request.get("body"), dict):
        raise ValueError("body must be an object")
    if request["body"].get("stream"):
        raise ValueError("a batch request is not streamed (stream must be false)")
