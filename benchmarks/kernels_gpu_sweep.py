"""Tile sweep of the attention kernels: ``python benchmarks/kernels_gpu.py --only sweep``.

Which tile shape (block_m, block_n, num_warps, num_stages) is fastest for
each Triton path, at Llama-3.1-8B shapes (``kernels_gpu.py`` builds the cases):

- "direct": the decode kernel with one program per (token, KV head), the
  runtime's path for decode batches that fill the GPU; batch 512 x context
  256/384/512 and 64 x 1024, over block_n 32/64/128, warps 2/4/8, stages 2/3/4;
- "one_launch" at prefill 512 and 2048 tokens (one request), over block_m
  64/128, block_n 32/64/128, warps 4/8, stages 2/3/4;
- "split": split-KV decode for a few requests at long contexts;
- with ``--only sweep_long``: one 8k prompt and the last 16k chunk of a 32k one, each
  through the block table ("one_launch") and from contiguous K/V ("fresh"), and
  one sequence's decode at 32k with the policy's splits and with 64 and 128.

Each case prints the default tiles' time and the best three (with their max
difference from the default's output); decode cases also print the KV
bandwidth reached (bytes of K and V read over the time) against the copy
bandwidth, prefill cases TFLOP/s. Every timing also goes to the JSONL records.

Compiling dominates: every (tile shape, specialisation) is one Triton compile
of one to two seconds, while timing one takes milliseconds. So a pool of
worker processes first compiles every kernel of the plan into Triton's
on-disk cache, and the timing process then only loads them. Cases left when
``SWEEP_BUDGET_S`` has passed are skipped (and say so).
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch

from octavo.kernels.paged_attention import TileConfig

DIRECT_SWEEP = [TileConfig(16, n, w, s) for n in (32, 64, 128) for w in (2, 4, 8) for s in (2, 3, 4)]
PREFILL_SWEEP = [TileConfig(m, n, w, s) for m in (64, 128) for n in (32, 64, 128) for w in (4, 8) for s in (2, 3, 4)]
SPLIT_SWEEP = [TileConfig(16, n, w, s) for n in (32, 64, 128) for w in (2, 4) for s in (2, 3)]
DIRECT_SHAPES = ((512, 256), (512, 384), (512, 512), (64, 1024))  # (batch, context)
PREFILL_TOKENS = (512, 2048)
SPLIT_SHAPES = ((1, 8192), (8, 8192))
SWEEP_REPS = 20
SWEEP_BUDGET_S = 200.0
LONG_SWEEP_BUDGET_S = 300.0  # sweep_long's step has 450 s


def sweep_plan(bench, long_context: bool = False) -> list[tuple[object, list[TileConfig], str]]:
    """(case, tile configs, path) in the order they run: the direct decode
    kernel first (the question of the next run), split-KV last. With
    ``long_context``: the long-context cases only (issue 26)."""
    decode = lambda b, ctx: bench.AttnCase(f"decode b={b} ctx={ctx}", [ctx] * b, [1] * b)  # noqa: E731
    if long_context:
        return long_context_plan(bench, decode)
    plan = [(decode(b, ctx), DIRECT_SWEEP, "direct") for b, ctx in DIRECT_SHAPES]
    plan += [(bench.AttnCase(f"prefill {n}", [n], [n]), PREFILL_SWEEP, "one_launch") for n in PREFILL_TOKENS]
    plan += [(decode(b, ctx), SPLIT_SWEEP, "split") for b, ctx in SPLIT_SHAPES]
    return plan


# Long context (issue 26): one 8,192-token prompt, the last 16,384-token chunk
# of a 32,768-token prompt (the engine's default budget for long prompts), and
# one sequence's decode at 32k. The env lines name each case's best tiles.
LONG_PREFILL = ((8192, 8192), (32768, 16384))  # (context, query tokens)
LONG_SPLIT = ((1, 32768),)
LONG_EXTRA_SPLITS = (64, 128)
LONG_ENV = {"one_launch": "OCTAVO_TILES_PREFILL", "split": "OCTAVO_TILES_SPLIT"}


def long_context_plan(bench, decode) -> list[tuple[object, list[TileConfig], str]]:
    prefill = [bench.AttnCase(f"prefill {q} @ {ctx}", [ctx], [q]) for ctx, q in LONG_PREFILL]
    # "fresh": the prompt's own keys from contiguous K/V (OCTAVO_PREFILL_FRESH_KV) against the block-table gather.
    plan = [(case, PREFILL_SWEEP, key) for case in prefill for key in ("one_launch", "fresh")]
    plan += [(decode(b, ctx), SPLIT_SWEEP, "split") for b, ctx in LONG_SPLIT]
    # More splits than the policy's 32 (two programs an SM): more loads in flight at 32k.
    plan += [(decode(b, ctx), SPLIT_SWEEP, f"split{n}") for b, ctx in LONG_SPLIT for n in LONG_EXTRA_SPLITS]
    return plan


def tiles_name(tiles: TileConfig) -> str:
    return f"m{tiles.block_m} n{tiles.block_n} w{tiles.num_warps} s{tiles.num_stages}"


def throughput(case, us: float, copy_bw: float) -> str:
    """KV bandwidth against the copy bandwidth for decode; TFLOP/s otherwise."""
    if case.is_decode:
        bw = case.kv_bytes / (us * 1e-6)
        return f"{bw / 1e12:5.2f} TB/s {100 * bw / copy_bw:5.1f}% of copy"
    return f"{case.flops / (us * 1e-6) / 1e12:6.1f} TFLOP/s"


def sweep(bench, case, configs: list[TileConfig], key: str, copy_bw: float, reps: int = SWEEP_REPS) -> TileConfig | None:
    """Time path ``key`` of ``case`` under each tile config; print the default and the best 3.
    Returns the fastest config where it beats the default, else None."""
    started = time.perf_counter()
    inputs = bench.AttnInputs(*bench.build_batch(case, torch.Generator().manual_seed(0)))
    base = bench.AttnCase(case.name, case.seq_lens, case.query_lens)
    default = bench.time_triton_paths(base, inputs, {}, (key,), reps)[key]
    default_us = base.results[f"{key}_us"]
    timings, failed = [], 0
    for config in configs:
        trial = bench.AttnCase(case.name, case.seq_lens, case.query_lens)
        try:
            out = bench.time_triton_paths(trial, inputs, {key: config}, (key,), reps)[key]
        except Exception as exc:  # a shape that does not fit (shared memory, registers)
            failed += 1
            bench.RECORDS.append({"sweep": key, "case": case.name, "config": asdict(config), "failed": str(exc)[:200]})
            continue
        us, error = trial.results[f"{key}_us"], bench.max_error(out, default)
        timings.append((us, config, error))
        bench.RECORDS.append(
            {"sweep": key, "case": case.name, "config": asdict(config), "error_vs_default": error,
             "kv_bytes": case.kv_bytes, **trial.results}
        )
    say = bench.say
    splits = f"  ({base.results['splits']} splits)" if "splits" in base.results else ""
    say(f"{key:10s} {case.name:24s} default {tiles_name(default_tiles(bench, case, key)):16s} "
        f"{default_us:9.1f} us  {throughput(case, default_us, copy_bw)}{splits}")
    for rank, (us, config, error) in enumerate(sorted(timings, key=lambda t: t[0])[:3], 1):
        say(f"{'':10s} {'':24s} best {rank}  {tiles_name(config):16s} {us:9.1f} us  "
            f"{throughput(case, us, copy_bw)}  x{default_us / us:4.2f}  err {error:.4f}")
    say(f"{'':10s} {'':24s} ({len(configs)} configs, {failed} did not run; {time.perf_counter() - started:.1f} s)")
    del inputs, default
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    best = min(timings, key=lambda t: t[0], default=None)
    return best[1] if best is not None and best[0] < default_us else None


def default_tiles(bench, case, key: str) -> TileConfig:
    from octavo.kernels.split_kv_decode import DIRECT_DECODE_TILES, SPLIT_TILES

    if key in ("one_launch", "fresh"):
        return bench.tiles_for(max(case.query_lens), bench.HEAD_SIZE)
    return DIRECT_DECODE_TILES if key == "direct" else SPLIT_TILES


def run_sweep(bench, copy_bw: float, budget_s: float | None = None, long_context: bool = False,
              env_file: str | None = None) -> None:
    """The sweep; with ``env_file``, each path's winner on the plan's last case
    of that path (the longest) as ``OCTAVO_TILES_*`` lines, for an end-to-end run."""
    started = time.perf_counter()
    if budget_s is None:
        budget_s = LONG_SWEEP_BUDGET_S if long_context else SWEEP_BUDGET_S
    plan = sweep_plan(bench, long_context)
    precompile(bench, plan)
    bench.say(f"tile sweep: default and best 3 per case (x: speed-up over the default; {SWEEP_REPS} reps)")
    winners = {}
    for case, configs, key in plan:
        if time.perf_counter() - started > budget_s:
            bench.say(f"{key:10s} {case.name:24s} skipped: the sweep's {budget_s:.0f} s are spent")
            continue
        winners[key] = sweep(bench, case, configs, key, copy_bw)
    bench.say(f"tile sweep took {time.perf_counter() - started:.0f} s")
    if env_file:
        lines = [f"{LONG_ENV[key]}={t.block_m},{t.block_n},{t.num_warps},{t.num_stages}"
                 for key, t in winners.items() if t is not None and key in LONG_ENV]
        Path(env_file).write_text("".join(line + "\n" for line in lines))
        bench.say("\n".join(lines) or "no config beat the defaults")


# ---------------------------------------------------------------- parallel compile

_WORKER_CASE: tuple | None = None  # (case name, case, inputs) last built in this worker


def _compile_job(job: tuple) -> str | None:
    """Worker process: run one (case, path, tiles) once so that its kernels land
    in Triton's disk cache; the error text if it cannot run."""
    global _WORKER_CASE
    import kernels_gpu as bench  # the real shapes (the worker's path is the parent's)

    name, seq_lens, query_lens, key, tiles = job
    if _WORKER_CASE is None or _WORKER_CASE[0] != name:
        _WORKER_CASE = None  # free the previous case's KV cache before building the next
        case = bench.AttnCase(name, seq_lens, query_lens)
        _WORKER_CASE = (name, case, bench.AttnInputs(*bench.build_batch(case, torch.Generator().manual_seed(0))))
    _, case, inputs = _WORKER_CASE
    try:
        bench.triton_path(case, inputs, key, tiles)[0]()
        torch.cuda.synchronize()
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc)[:100]}"
    return None


def precompile(bench, plan) -> None:
    """Compile every kernel of ``plan`` in worker processes (see the module docstring)."""
    started = time.perf_counter()
    jobs = [
        (case.name, case.seq_lens, case.query_lens, key, tiles)
        for case, configs, key in plan
        for tiles in [None, *configs]
    ]
    # One job per case and tile shape; a worker takes neighbours, which share a case.
    compile_in_pool(_compile_job, jobs, bench.say, started)


def compile_in_pool(job_fn, jobs: list, say, started: float, chunksize: int | None = None) -> None:
    """Run ``job_fn`` (a module-level function returning an error text or None)
    over ``jobs`` in spawned worker processes, so that every kernel lands in
    Triton's disk cache. Any failure of the pool only costs time: the timing
    process compiles what is missing."""
    workers = max(1, min(len(jobs), (os.cpu_count() or 2) - 2, 14))
    if chunksize is None:
        chunksize = max(1, len(jobs) // (4 * workers))
    context = multiprocessing.get_context("spawn")  # CUDA cannot be forked
    try:
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
            errors = [e for e in pool.map(job_fn, jobs, chunksize=chunksize) if e]
    except Exception as exc:
        say(f"parallel compile failed ({type(exc).__name__}: {str(exc)[:100]}); compiling while timing")
        return
    say(f"compiled {len(jobs)} kernels in {workers} processes in {time.perf_counter() - started:.0f} s "
        f"({len(errors)} did not run)")
