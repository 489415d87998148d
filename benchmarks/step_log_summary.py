#!/usr/bin/env python
"""Summarise engine step logs (``OCTAVO_STEP_LOG``, see ``octavo/core/step_log.py``).

    python benchmarks/step_log_summary.py PATH.*

Each file is one engine process. A file is cut into runs wherever the
engine sat idle for more than ``--idle`` seconds (a server between load
levels); per run: its span, output-side figures (decode steps, requests a
decode step carried, ms per decode step), prefill/mixed steps and their
tokens, and the time between batches beyond the median step of its kind
(the loop waiting for work or doing host work between steps).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def runs(steps: list[dict], idle: float) -> list[list[dict]]:
    cut: list[list[dict]] = []
    for step in steps:
        if not cut or step["dt"] > idle:
            cut.append([])
        cut[-1].append(step)
    return [run for run in cut if len(run) > 1]


def summarise(run: list[dict]) -> dict:
    body = run[1:]  # the first batch's dt includes the idle time before it
    decode = [s for s in body if s["prefill_tokens"] == 0]
    mixed = [s for s in body if s["prefill_tokens"] > 0]
    span = run[-1]["t"] - run[0]["t"]

    def excess(group: list[dict]) -> float:
        if not group:
            return 0.0
        typical = statistics.median(s["dt"] for s in group)
        return sum(max(0.0, s["dt"] - 2 * typical) for s in group)

    return {
        "span_s": span,
        "steps": len(body),
        "decode_steps": len(decode),
        "decode_ms": 1e3 * statistics.mean(s["dt"] for s in decode) if decode else 0.0,
        "decode_reqs": statistics.mean(s["reqs"] for s in decode) if decode else 0.0,
        "mixed_steps": len(mixed),
        "mixed_ms": 1e3 * statistics.mean(s["dt"] for s in mixed) if mixed else 0.0,
        "mixed_tokens": statistics.mean(s["tokens"] for s in mixed) if mixed else 0.0,
        "tokens_per_s": sum(s["tokens"] for s in body) / span if span else 0.0,
        "samples_per_s": sum(s["reqs"] for s in body) / span if span else 0.0,
        "mean_running": statistics.mean(s["running"] for s in body),
        "mean_waiting": statistics.mean(s["waiting"] for s in body),
        "excess_gaps_s": excess(decode) + excess(mixed),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--idle", type=float, default=1.0, help="seconds of no batch that end a run")
    args = parser.parse_args(argv)
    header = ("file", "run", "span s", "steps", "decode", "ms/dec", "reqs/dec", "mixed", "ms/mix", "tok/mix",
              "samples/s", "running", "waiting", "gaps s")
    print(" ".join(f"{h:>9}" for h in header))
    for path in args.paths:
        for index, run in enumerate(runs(read(path), args.idle)):
            s = summarise(run)
            row = (path.name[-9:], index, f"{s['span_s']:.2f}", s["steps"], s["decode_steps"], f"{s['decode_ms']:.1f}",
                   f"{s['decode_reqs']:.0f}", s["mixed_steps"], f"{s['mixed_ms']:.1f}", f"{s['mixed_tokens']:.0f}",
                   f"{s['samples_per_s']:.0f}", f"{s['mean_running']:.0f}", f"{s['mean_waiting']:.0f}",
                   f"{s['excess_gaps_s']:.2f}")
            print(" ".join(f"{str(v):>9}" for v in row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
