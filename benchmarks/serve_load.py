"""Load benchmark for a running ``octavo serve`` (a benchmark, not a test).

Sends ``--num-requests`` streaming requests, at most ``--concurrency`` at a
time, and prints requests/s, output tokens/s, and TTFT, inter-token latency
and end-to-end latency percentiles. Each request streams with
``stream_options.include_usage`` so that token counts are the server's own.
Works against any OpenAI-compatible server.

    octavo serve MODEL &
    python benchmarks/serve_load.py --concurrency 64 --num-requests 512 --max-tokens 128
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field

import httpx
from tqdm.auto import tqdm

WORDS = "the quick brown fox jumps over a lazy dog while small birds sing in the quiet forest".split()


@dataclass
class RequestResult:
    ok: bool
    ttft_s: float | None = None
    e2e_s: float = 0.0
    token_gaps_s: list[float] = field(default_factory=list)
    num_output_tokens: int = 0
    error: str | None = None


def make_prompt(rng: random.Random, num_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(num_words))


def request_body(args: argparse.Namespace, prompt: str) -> dict:
    body = {
        "model": args.model,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    if args.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def chunk_has_output(chunk: dict) -> bool:
    """A chunk that carries generated tokens (its text may be empty: a partial character).

    Not the usage chunk (no choices) and not chat's opening role chunk.
    """
    choices = chunk.get("choices") or []
    return bool(choices) and not any("role" in (choice.get("delta") or {}) for choice in choices)


async def one_request(client: httpx.AsyncClient, path: str, body: dict) -> RequestResult:
    started = time.perf_counter()
    result = RequestResult(ok=False)
    last = None
    try:
        async with client.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                await response.aread()
                result.error = f"HTTP {response.status_code}: {response.text[:200]}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: "):])
                if "error" in chunk:
                    result.error = chunk["error"].get("message")
                    return result
                now = time.perf_counter()
                if chunk.get("usage"):
                    result.num_output_tokens = chunk["usage"]["completion_tokens"]
                if chunk_has_output(chunk):
                    if result.ttft_s is None:
                        result.ttft_s = now - started
                    else:
                        result.token_gaps_s.append(now - last)
                    last = now
    except httpx.HTTPError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.e2e_s = time.perf_counter() - started
    result.ok = True
    return result


def percentiles(values: list[float], points=(50, 90, 99)) -> dict[str, float]:
    if not values:
        return {f"p{p}": float("nan") for p in points}
    ordered = sorted(values)
    return {f"p{p}": ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))] for p in points}


async def run(args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    path = "/v1/chat/completions" if args.endpoint == "chat" else "/v1/completions"
    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)
    semaphore = asyncio.Semaphore(args.concurrency)
    results: list[RequestResult] = []
    async with httpx.AsyncClient(base_url=args.url, headers=headers, timeout=args.timeout, limits=limits) as client:
        if args.model is None:
            args.model = (await client.get("/v1/models")).json()["data"][0]["id"]
        bodies = [request_body(args, make_prompt(rng, args.prompt_words)) for _ in range(args.num_requests)]
        progress = tqdm(total=args.num_requests, desc=f"{args.endpoint} x{args.concurrency}", unit="req")

        async def limited(body: dict) -> None:
            async with semaphore:
                results.append(await one_request(client, path, body))
                progress.update(1)

        started = time.perf_counter()
        await asyncio.gather(*(limited(body) for body in bodies))
        elapsed = time.perf_counter() - started
        progress.close()
    return summarize(args, results, elapsed)


def summarize(args: argparse.Namespace, results: list[RequestResult], elapsed_s: float) -> dict:
    ok = [r for r in results if r.ok]
    errors = [r.error for r in results if not r.ok]
    num_tokens = sum(r.num_output_tokens for r in ok)
    return {
        "endpoint": args.endpoint,
        "concurrency": args.concurrency,
        "num_requests": len(results),
        "num_failed": len(errors),
        "first_errors": errors[:3],
        "elapsed_s": elapsed_s,
        "requests_per_s": len(ok) / elapsed_s if elapsed_s else 0.0,
        "output_tokens_per_s": num_tokens / elapsed_s if elapsed_s else 0.0,
        "ttft_ms": {k: v * 1e3 for k, v in percentiles([r.ttft_s for r in ok if r.ttft_s is not None]).items()},
        "itl_ms": {k: v * 1e3 for k, v in percentiles([g for r in ok for g in r.token_gaps_s]).items()},
        "e2e_ms": {k: v * 1e3 for k, v in percentiles([r.e2e_s for r in ok]).items()},
        "mean_output_tokens": statistics.mean(r.num_output_tokens for r in ok) if ok else 0.0,
    }


def print_table(summary: dict) -> None:
    print(f"\n{summary['endpoint']}: {summary['num_requests']} requests at concurrency {summary['concurrency']}, "
          f"{summary['num_failed']} failed, {summary['elapsed_s']:.2f} s")
    print(f"  requests/s          {summary['requests_per_s']:10.2f}")
    print(f"  output tokens/s     {summary['output_tokens_per_s']:10.1f}")
    print(f"  {'':18}{'p50':>10}{'p90':>10}{'p99':>10}")
    for label, key in (("TTFT (ms)", "ttft_ms"), ("ITL (ms)", "itl_ms"), ("end-to-end (ms)", "e2e_ms")):
        row = summary[key]
        print(f"  {label:18}{row['p50']:10.2f}{row['p90']:10.2f}{row['p99']:10.2f}")
    for error in summary["first_errors"]:
        print(f"  error: {error}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--model", default=None, help="default: the server's first model")
    parser.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--prompt-words", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", default=None, help="also write the summary here")
    args = parser.parse_args()
    summary = asyncio.run(run(args))
    print_table(summary)
    if args.json_out:
        with open(args.json_out, "w") as out:
            json.dump(summary, out, indent=2)


if __name__ == "__main__":
    main()
