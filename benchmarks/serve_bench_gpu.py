"""The server against the offline engine on one workload, in one round (issue 19).

    python benchmarks/serve_bench_gpu.py --out DIR [--concurrencies 1 64 256 1024]
        [--engine-args "--max-num-batched-tokens 2048"] [--server-args "--api-server-count 2"]

1. The offline engine (``OctavoRunner``, a subprocess so that the server
   later gets the whole device): output tokens/s over ``--offline-prompts``
   prompts of ``--input-len`` random tokens and ``--output-len`` outputs
   (greedy, ignore_eos), and the time it needs to prefill ``--prefill-batch``
   prompts at once (one output token each).
2. ``octavo serve`` on the same model and engine options, then ``octavo
   bench serve`` (random dataset, the same lengths, ignore_eos, streamed
   completions) at each concurrency, with the CPU seconds each server
   process spent during that level (the API process(es) and the engine
   process(es), told apart by the pids the server logs).
3. One table: server output tok/s beside the offline engine's (target
   >= 90% at 256 and 1,024 streams), failures, TTFT p99 against the
   prefill time of ``--prefill-batch`` prompts (target <= 2x at 256).

Default model: Llama-3.1-8B's shapes with random weights and a byte-level
tokenizer (``--config``); ``--model DIR`` serves a real checkpoint instead
(the CPU smoke test uses the demo model).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "octavo.entrypoints.cli.main"]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--config", default=str(ROOT / "benchmarks/configs/llama-3.1-8b.json"))
    p.add_argument("--model", default=None, help="a checkpoint directory (default: --config with random weights)")
    p.add_argument("--load-format", default=None, help="default: dummy with --config, auto with --model")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--concurrencies", type=int, nargs="+", default=[1, 64, 256, 1024])
    p.add_argument("--prompts-per-stream", type=float, default=2.0, help="prompts per level = this x concurrency")
    p.add_argument("--min-prompts", type=int, default=16)
    p.add_argument("--offline-prompts", type=int, default=1024)
    p.add_argument("--prefill-batch", type=int, default=256)
    p.add_argument("--engine-args", default="", help="engine options for both the server and the offline engine")
    p.add_argument("--server-args", default="", help="options for the server only (e.g. --api-server-count 2)")
    p.add_argument("--no-offline", action="store_true", help="skip the offline engine (its figures come from another run)")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--label", default="serve_bench")
    p.add_argument("--offline-only", action="store_true", help=argparse.SUPPRESS)  # the subprocess of step 1
    return p.parse_args(argv)


def model_dir(args, work: Path) -> tuple[Path, list[str]]:
    """The checkpoint to serve and the load options that go with it."""
    if args.model:
        return Path(args.model), ["--load-format", args.load_format or "auto", "--dtype", args.dtype]
    from octavo.default_model import build_byte_bpe_tokenizer

    directory = work / "model"
    directory.mkdir()
    (directory / "config.json").write_text(Path(args.config).read_text())
    build_byte_bpe_tokenizer(directory)
    return directory, ["--load-format", "dummy", "--dtype", args.dtype]


def engine_options(args, load: list[str]) -> list[str]:
    return [*load, "--max-model-len", str(args.max_model_len), *shlex.split(args.engine_args)]


def run_offline(args, model: Path, load: list[str]) -> dict:
    """In this (fresh) process: offline output tok/s and the prefill time of one batch."""
    from octavo.benchmarks.runs import OctavoRunner, random_prompts
    from octavo.entrypoints.cli.common import add_engine_args, engine_args_from

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    engine_args = engine_args_from(parser.parse_args(["--model", str(model), *engine_options(args, load)]))
    runner = OctavoRunner(engine_args)
    try:
        vocab = runner.vocab_size
        runner.run(random_prompts(8, args.input_len, vocab, seed=99), 4)  # warm up
        prompts = random_prompts(args.offline_prompts, args.input_len, vocab)
        seconds = runner.run(prompts, args.output_len)
        prefill = runner.run(random_prompts(args.prefill_batch, args.input_len, vocab, seed=7), 1)
        budget = runner.engine.scheduler.config.max_num_batched_tokens
    finally:
        runner.close()
    return {"offline_tok_s": args.offline_prompts * args.output_len / seconds, "offline_seconds": seconds,
            "prefill_seconds": prefill, "max_num_batched_tokens": budget}


def start_server(args, model: Path, load: list[str], out: Path) -> subprocess.Popen:
    command = [*CLI, "serve", str(model), *engine_options(args, load), "--port", str(args.port),
               "--served-model-name", "bench", "--disable-uvicorn-access-log", *shlex.split(args.server_args)]
    log = open(out / f"{args.label}_server.log", "wb")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited ({server.returncode}); see {log.name}")
        try:
            if httpx.get(f"http://127.0.0.1:{args.port}/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(1)
    server.kill()
    raise RuntimeError("the server did not become healthy")


def server_processes(log_text: str, server_pid: int) -> dict[int, str]:
    """pid -> "api" or "engine", from what the server logged (the main process is an API process
    unless it launched several)."""
    roles = {int(pid): "engine" for pid in re.findall(r"replica \d+ started in its own process \(pid (\d+)\)", log_text)}
    api_pids = [int(pid) for pid in re.findall(r"API server \d+ started \(pid (\d+)\)", log_text)]
    roles.update({pid: "api" for pid in api_pids} or {server_pid: "api"})
    return roles


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_level(args, tokenizer: Path, concurrency: int, out: Path) -> dict:
    from octavo.benchmarks.serve_bench import add_parser, benchmark

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    num_prompts = max(args.min_prompts, round(args.prompts_per_stream * concurrency))
    bench_args = parser.parse_args([
        "serve", "--base-url", f"http://127.0.0.1:{args.port}", "--model", "bench", "--tokenizer", str(tokenizer),
        "--dataset-name", "random", "--random-input-len", str(args.input_len), "--random-output-len",
        str(args.output_len), "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency),
        "--ignore-eos", "--disable-tqdm", "--seed", str(concurrency),
    ])
    report, payload = asyncio.run(benchmark(bench_args))
    print(report.table(), flush=True)
    (out / f"{args.label}_c{concurrency}.json").write_text(json.dumps(payload, indent=2))
    return payload


def table(args, offline: dict | None, levels: list[dict]) -> str:
    lines = [f"{args.label}: {args.input_len}-token prompts (random), {args.output_len} out, ignore_eos; "
             f"engine args [{args.engine_args}], server args [{args.server_args}]"]
    if offline:
        lines.append(f"offline engine: {offline['offline_tok_s']:,.0f} out tok/s ({args.offline_prompts} prompts); "
                     f"prefill of {args.prefill_batch} prompts {offline['prefill_seconds'] * 1e3:,.0f} ms; "
                     f"step budget {offline['max_num_batched_tokens']} tokens")
    header = ("streams", "prompts", "failed", "out tok/s", "vs offline", "TTFT p50/p99 ms", "p99/prefill",
              "ITL p50/p99 ms", "TPOT p50 ms", "API CPU", "engine CPU")
    rows = [header]
    for level in levels:
        ratio = f"{level['output_throughput'] / offline['offline_tok_s']:.0%}" if offline else "n/a"
        prefill = f"{level['p99_ttft_ms'] / 1e3 / offline['prefill_seconds']:.2f}x" if offline else "n/a"
        rows.append((str(level["max_concurrency"]), str(level["completed"] + level["failed"]), str(level["failed"]),
                     f"{level['output_throughput']:,.0f}", ratio,
                     f"{level['p50_ttft_ms']:,.0f} / {level['p99_ttft_ms']:,.0f}", prefill,
                     f"{level['p50_itl_ms']:.1f} / {level['p99_itl_ms']:.1f}", f"{level['median_tpot_ms']:.1f}",
                     level["cpu"]["api"], level["cpu"]["engine"]))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines += ["  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in rows]
    lines.append("API/engine CPU: busy share of one core per process kind during the level (sum over processes).")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="serve-bench-"))
    model, load = model_dir(args, work)
    if args.offline_only:
        print(json.dumps(run_offline(args, model, load)))
        return 0
    offline = None
    if not args.no_offline:
        same_model = ["--model", str(model), "--load-format", load[1]]
        done = subprocess.run([sys.executable, __file__, *(argv or sys.argv[1:]), "--offline-only", *same_model],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"the offline run failed:\n{done.stderr[-3000:]}")
        offline = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"offline: {offline}", flush=True)
    server = start_server(args, model, load, out)
    levels = []
    try:
        roles = server_processes((out / f"{args.label}_server.log").read_text(errors="replace"), server.pid)
        for concurrency in args.concurrencies:
            before, started = {pid: cpu_seconds(pid) for pid in roles}, time.perf_counter()
            level = bench_level(args, model, concurrency, out)
            wall = time.perf_counter() - started
            busy = {"api": 0.0, "engine": 0.0}
            for pid, role in roles.items():
                busy[role] += (cpu_seconds(pid) - before[pid]) / wall
            level["cpu"] = {role: f"{share:.0%}" for role, share in busy.items()}
            levels.append(level)
        metrics = httpx.get(f"http://127.0.0.1:{args.port}/metrics", timeout=30).text
        (out / f"{args.label}_metrics.txt").write_text(metrics)
    finally:
        server.send_signal(signal.SIGTERM)
        status = server.wait(timeout=120)
    summary = table(args, offline, levels)
    print(summary)
    print(f"server exit status: {status}")
    (out / f"{args.label}_table.txt").write_text(summary + "\n")
    (out / f"{args.label}.json").write_text(json.dumps({"offline": offline, "levels": levels}, indent=2))
    return 0 if status == 0 and all(level["failed"] == 0 for level in levels) else 1


if __name__ == "__main__":
    sys.exit(main())
