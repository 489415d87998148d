"""What ``octavo bench serve`` reports: throughput, latency percentiles,
goodput under SLOs, and failures with their errors (vLLM's metric names).

TTFT: time to the first output chunk. TPOT: (end-to-end - TTFT) /
(output tokens - 1), per request. ITL: every gap between output chunks.
E2EL: request start to ``[DONE]``. Goodput: completed requests per second
that met every SLO given (``--goodput ttft:MS tpot:MS e2el:MS``).
Throughputs count completed requests only, over the whole run.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass

from octavo.benchmarks.serve_client import RequestResult

METRIC_NAMES = ("ttft", "tpot", "itl", "e2el")
METRIC_TITLES = {"ttft": "Time to first token", "tpot": "Time per output token (excl. 1st)",
                 "itl": "Inter-token latency", "e2el": "End-to-end latency"}


def parse_goodput(items: list[str] | None) -> dict[str, float]:
    """``["ttft:500", "tpot:50"]`` -> ``{"ttft": 0.5, "tpot": 0.05}`` (seconds)."""
    slos = {}
    for item in items or []:
        name, _, value = item.partition(":")
        if name not in ("ttft", "tpot", "e2el") or not value:
            raise ValueError(f"--goodput takes ttft:MS, tpot:MS or e2el:MS, got {item!r}")
        slos[name] = float(value) / 1e3
    return slos


def _tpot(result: RequestResult) -> float | None:
    if result.output_tokens > 1:
        return (result.latency_s - result.ttft_s) / (result.output_tokens - 1)
    return None


@dataclass
class Report:
    values: dict

    def table(self) -> str:
        v = self.values
        rows = [
            ("Successful requests", f"{v['completed']}"),
            ("Failed requests", f"{v['failed']}"),
            ("Maximum request concurrency", f"{v['max_concurrency'] or 'unlimited'}"),
            ("Request rate (req/s)", f"{v['request_rate']}"),
            ("Benchmark duration (s)", f"{v['duration']:.2f}"),
            ("Total input tokens", f"{v['total_input_tokens']}"),
            ("Total generated tokens", f"{v['total_output_tokens']}"),
            ("Request throughput (req/s)", f"{v['request_throughput']:.2f}"),
            ("Output token throughput (tok/s)", f"{v['output_throughput']:.2f}"),
            ("Total token throughput (tok/s)", f"{v['total_token_throughput']:.2f}"),
        ]
        if v.get("request_goodput") is not None:
            rows.append(("Request goodput (req/s)", f"{v['request_goodput']:.2f}"))
        lines = [f"{' Serving Benchmark Result ':=^60}"] + [f"{k:<44}{val:>16}" for k, val in rows]
        for name in METRIC_NAMES:
            lines.append(f"{' ' + METRIC_TITLES[name] + ' ':-^60}")
            for stat in ("mean", "median", *(f"p{p:g}" for p in v["percentiles"])):
                value = v[f"{stat}_{name}_ms"]
                lines.append(f"{f'{stat.capitalize()} {name.upper()} (ms)':<44}{value:>16.2f}")
        for error, count in v["errors"][:5]:
            lines.append(f"error x{count}: {error[:200]}")
        lines.append("=" * 60)
        return "\n".join(lines)


def summarize(results: list[RequestResult], duration_s: float, percentiles: list[float], slos: dict[str, float],
              request_rate: float, max_concurrency: int | None) -> Report:
    done = [r for r in results if r.success]
    failed = [r for r in results if not r.success]
    samples = {
        "ttft": [r.ttft_s for r in done],
        "tpot": [t for r in done if (t := _tpot(r)) is not None],
        "itl": [gap for r in done for gap in r.itl_s],
        "e2el": [r.latency_s for r in done],
    }
    total_in = sum(r.prompt_len for r in done)
    total_out = sum(r.output_tokens for r in done)
    values = {
        "completed": len(done), "failed": len(failed), "duration": duration_s,
        "request_rate": request_rate, "max_concurrency": max_concurrency, "percentiles": percentiles,
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(done) / duration_s, "output_throughput": total_out / duration_s,
        "total_token_throughput": (total_in + total_out) / duration_s,
        "request_goodput": _goodput(done, slos) / duration_s if slos else None,
        "errors": Counter(r.error for r in failed).most_common(),
    }
    for name, data in samples.items():
        values.update(_stats(name, [x * 1e3 for x in data], percentiles))
    return Report(values)


def _stats(name: str, data_ms: list[float], percentiles: list[float]) -> dict[str, float]:
    if not data_ms:
        return {f"{s}_{name}_ms": 0.0 for s in ("mean", "median", "std", *(f"p{p:g}" for p in percentiles))}
    ordered = sorted(data_ms)
    stats = {f"mean_{name}_ms": statistics.fmean(ordered), f"median_{name}_ms": statistics.median(ordered),
             f"std_{name}_ms": statistics.pstdev(ordered)}
    for p in percentiles:
        stats[f"p{p:g}_{name}_ms"] = _percentile(ordered, p)
    return stats


def _percentile(ordered: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    position = (len(ordered) - 1) * p / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _goodput(done: list[RequestResult], slos: dict[str, float]) -> int:
    def meets(result: RequestResult) -> bool:
        measured = {"ttft": result.ttft_s, "tpot": _tpot(result) or 0.0, "e2el": result.latency_s}
        return all(measured[name] <= limit for name, limit in slos.items())

    return sum(1 for r in done if meets(r))
