"""The server's periodic stats line (vLLM's), every 10 seconds (vLLM's
``VLLM_LOG_STATS_INTERVAL``) in which anything happened;
``--disable-log-stats`` turns it off.

    Engine 000: Avg prompt throughput: 512.0 tokens/s, Avg generation throughput: 48.2 tokens/s,
    Running: 3 reqs, Waiting: 0 reqs, KV cache usage: 4.1%, Prefix cache hit rate: 25.0%

Throughputs and the hit rate are over the interval; the counts and the KV
usage are the engine's now. With speculative decoding a second line gives
the interval's drafts: mean acceptance length, accepted and drafted tokens
and their rates, the acceptance rate by draft position. The token counts
are the server's own (``ServerMetrics``: prompt tokens of the requests it
admitted, tokens it streamed back), so with several API processes each
logs its own requests' share beside the engine-wide counts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from octavo.core.scheduler_config import SchedulerStats, SpecDecodingStats

logger = logging.getLogger("octavo.stats")


@dataclass(frozen=True)
class _Reading:
    time: float
    prompt_tokens: int
    generation_tokens: int
    prefix_queries: int
    prefix_hits: int
    spec: SpecDecodingStats | None


class StatsLog:
    """Turns successive readings into the lines to log (the first reading only sets the baseline)."""

    def __init__(self, label: str = "Engine 000") -> None:
        self.label = label
        self._last: _Reading | None = None

    def lines(self, now: float, prompt_tokens: int, generation_tokens: int, stats: SchedulerStats) -> list[str]:
        prefix = stats.prefix_cache
        reading = _Reading(now, prompt_tokens, generation_tokens, prefix.num_queries, prefix.num_hits, stats.spec_decoding)
        last, self._last = self._last, reading
        if last is None:
            return []
        prompt, generated = prompt_tokens - last.prompt_tokens, generation_tokens - last.generation_tokens
        if not (prompt or generated or stats.num_running or stats.num_waiting):
            return []  # an idle interval: nothing to say
        seconds = max(now - last.time, 1e-9)
        queries = prefix.num_queries - last.prefix_queries
        hit_rate = (prefix.num_hits - last.prefix_hits) / queries if queries > 0 else 0.0
        lines = [
            f"{self.label}: Avg prompt throughput: {prompt / seconds:.1f} tokens/s, "
            f"Avg generation throughput: {generated / seconds:.1f} tokens/s, "
            f"Running: {stats.num_running} reqs, Waiting: {stats.num_waiting} reqs, "
            f"KV cache usage: {100 * stats.kv_cache_usage:.1f}%, Prefix cache hit rate: {100 * hit_rate:.1f}%"
        ]
        spec = _spec_line(stats.spec_decoding, last.spec, seconds)
        if spec is not None:
            lines.append(f"{self.label}: {spec}")
        return lines


def _spec_line(now: SpecDecodingStats | None, before: SpecDecodingStats | None, seconds: float) -> str | None:
    if now is None:
        return None
    before = before or SpecDecodingStats()
    drafts = now.num_drafts - before.num_drafts
    drafted = now.num_draft_tokens - before.num_draft_tokens
    accepted = now.num_accepted_tokens - before.num_accepted_tokens
    if drafts <= 0 or drafted <= 0:
        return None
    earlier = before.accepted_per_position
    per_position = [
        (count - (earlier[i] if i < len(earlier) else 0)) / drafts for i, count in enumerate(now.accepted_per_position)
    ]
    rates = ", ".join(f"{rate:.3f}" for rate in per_position)
    return (
        f"SpecDecoding metrics: Mean acceptance length: {1 + accepted / drafts:.2f}, "
        f"Accepted throughput: {accepted / seconds:.2f} tokens/s, Drafted throughput: {drafted / seconds:.2f} tokens/s, "
        f"Accepted: {accepted} tokens, Drafted: {drafted} tokens, Per-position acceptance rate: {rates}, "
        f"Avg Draft acceptance rate: {100 * accepted / drafted:.1f}%"
    )


async def log_stats_periodically(ctx, interval_s: float, label: str = "Engine 000") -> None:
    """Log the stats line every ``interval_s`` seconds until cancelled (the app's lifespan runs it)."""
    stats_log = StatsLog(label)
    while True:
        try:
            snapshot = await ctx.engine.get_snapshot()
        except Exception:  # a dead or restarting engine: /health says so; try again next interval
            logger.debug("no engine stats this interval", exc_info=True)
        else:
            metrics = ctx.metrics
            for line in stats_log.lines(
                time.monotonic(), metrics.num_prompt_tokens, metrics.num_generation_tokens, snapshot.stats
            ):
                logger.info("%s", line)
        await asyncio.sleep(interval_s)
