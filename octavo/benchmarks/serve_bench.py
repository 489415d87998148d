"""``octavo bench serve``: load any OpenAI-compatible server and report what
its clients saw (modelled on ``vllm bench serve``, with its flag names).

Requests start on a Poisson process (``--request-rate``, ``inf``: all at
once; ``--burstiness`` makes the gaps gamma-distributed, 1 = Poisson), at
most ``--max-concurrency`` at a time. One request is sent first to check
the settings and is not counted. The key comes from ``--api-key`` or
``OPENAI_API_KEY``. Prints the table and writes ``--output-json``.

The client's connections are reused for at most ``KEEPALIVE_EXPIRY_S`` idle
seconds: a connection reused just as the server's own keep-alive timer
closes it fails the request with a ``ReadError`` that the server never saw
(uvicorn closes idle connections after 5 s, httpx's default expiry is 5 s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time

from octavo.benchmarks.serve_client import RequestResult, RequestSettings, send_request
from octavo.benchmarks.serve_datasets import DATASET_NAMES, SampleRequest, count_tokens, sample_requests
from octavo.benchmarks.serve_report import Report, parse_goodput, summarize

KEEPALIVE_EXPIRY_S = 1.0


def add_parser(kinds) -> None:
    p = kinds.add_parser("serve", help="load an OpenAI-compatible server: latency percentiles, throughput, failures")
    p.add_argument("--base-url", default=None, help="the server (default http://HOST:PORT)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--endpoint", default="/v1/completions", help="/v1/completions or /v1/chat/completions")
    p.add_argument("--model", default=None, help="the model name to send (default: the server's first)")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: --model, or the server's model path)")
    p.add_argument("--api-key", default=None, help="bearer key (default: $OPENAI_API_KEY)")
    p.add_argument("--dataset-name", choices=DATASET_NAMES, default="random")
    p.add_argument("--dataset-path", default=None, help="ShareGPT-format JSON for --dataset-name sharegpt")
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--random-input-len", type=int, default=1024)
    p.add_argument("--random-output-len", type=int, default=128)
    p.add_argument("--random-range-ratio", type=float, default=0.0, help="lengths uniform in len * [1 - r, 1 + r]")
    p.add_argument("--random-prefix-len", type=int, default=0, help="tokens every random prompt starts with")
    p.add_argument("--sharegpt-output-len", type=int, default=None)
    p.add_argument("--prefix-repetition-prefix-len", type=int, default=256)
    p.add_argument("--prefix-repetition-suffix-len", type=int, default=256)
    p.add_argument("--prefix-repetition-num-prefixes", type=int, default=10)
    p.add_argument("--prefix-repetition-output-len", type=int, default=128)
    p.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s (Poisson); inf: all at once")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the gaps (1: Poisson)")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--ignore-eos", action="store_true", help="send ignore_eos (vLLM's extension) for exact output lengths")
    p.add_argument("--goodput", nargs="+", default=None, metavar="SLO", help="ttft:MS tpot:MS e2el:MS")
    p.add_argument("--metric-percentiles", default="50,90,99")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds one request may take")
    p.add_argument("--disable-tqdm", action="store_true")
    p.add_argument("--output-json", default=None)
    p.add_argument("--save-detailed", action="store_true", help="per-request TTFT, ITL, latency, errors in the JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    report, payload = asyncio.run(benchmark(args))
    print(report.table())
    if args.output_json:
        with open(args.output_json, "w") as out:
            json.dump(payload, out, indent=2)
    return 0


def _base_url(args) -> str:
    return (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")


async def _server_model(client) -> tuple[str, str | None]:
    """The server's first model name, and its local path if it says (Octavo's ``root``)."""
    card = (await client.get("/v1/models")).raise_for_status().json()["data"][0]
    return card["id"], card.get("root")


def _load_tokenizer(args, server_root: str | None):
    from octavo.core.tokenizer import load_tokenizer

    for candidate in (args.tokenizer, args.model, server_root):
        if candidate and os.path.isdir(candidate):
            return load_tokenizer(candidate)
    raise ValueError("no tokenizer: pass --tokenizer DIR (the prompts are measured in its tokens)")


async def benchmark(args) -> tuple[Report, dict]:
    import httpx

    api_key = args.api_key or os.environ.get("OPENAI_API_KEY")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=args.max_concurrency, max_keepalive_connections=args.max_concurrency,
                          keepalive_expiry=KEEPALIVE_EXPIRY_S)
    async with httpx.AsyncClient(base_url=_base_url(args), headers=headers, timeout=args.timeout, limits=limits) as client:
        served, root = await _server_model(client)
        model = args.model or served
        tokenizer = _load_tokenizer(args, root)
        samples = sample_requests(args, tokenizer, random.Random(args.seed))
        settings = RequestSettings(args.endpoint, model, args.temperature, args.ignore_eos)
        check = await send_request(client, settings, samples[0])
        if not check.success:
            raise RuntimeError(f"the first (untimed) request failed: {check.error}")
        started = time.perf_counter()
        results = await _run_load(client, settings, samples, args)
        duration = time.perf_counter() - started
    for result in results:
        if result.success and not result.output_tokens:  # the server sent no usage
            result.output_tokens = count_tokens(tokenizer, result.generated_text)
    percentiles = [float(p) for p in args.metric_percentiles.split(",")]
    report = summarize(results, duration, percentiles, parse_goodput(args.goodput), args.request_rate, args.max_concurrency)
    payload = {"base_url": _base_url(args), "endpoint": args.endpoint, "model": model, "dataset": args.dataset_name,
               "num_prompts": len(samples), **report.values}
    if args.save_detailed:
        payload["requests"] = [vars(r) | {"generated_text": None} for r in results]
    return report, payload


async def _run_load(client, settings: RequestSettings, samples: list[SampleRequest], args) -> list[RequestResult]:
    from tqdm.auto import tqdm

    progress = None if args.disable_tqdm else tqdm(total=len(samples), unit="req", desc="bench serve")
    semaphore = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None

    async def one(sample: SampleRequest) -> RequestResult:
        if semaphore is None:
            result = await send_request(client, settings, sample)
        else:
            async with semaphore:
                result = await send_request(client, settings, sample)
        if progress is not None:
            progress.update(1)
        return result

    tasks = []
    rng = random.Random(args.seed + 1)
    for sample in samples:
        tasks.append(asyncio.create_task(one(sample)))
        delay = _next_gap(args.request_rate, args.burstiness, rng)
        if delay:
            await asyncio.sleep(delay)
    results = await asyncio.gather(*tasks)
    if progress is not None:
        progress.close()
    return list(results)


def _next_gap(rate: float, burstiness: float, rng: random.Random) -> float:
    """Seconds until the next request starts: gamma(burstiness, 1 / (rate * burstiness)); 0 at an infinite rate."""
    if rate == float("inf"):
        return 0.0
    return rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
