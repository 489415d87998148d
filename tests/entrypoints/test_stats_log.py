"""The periodic stats line (vLLM's): throughputs and the prefix-cache hit
rate over the interval, the engine's counts now; nothing for an idle
interval; a speculative-decoding line when drafts were made; logged by a
running server and off with --disable-log-stats."""

from __future__ import annotations

import logging

from octavo.core.kv_cache_manager import PrefixCacheStats
from octavo.core.scheduler_config import SchedulerStats, SpecDecodingStats
from octavo.entrypoints.stats_log import StatsLog


def stats(running=0, waiting=0, usage=0.0, queries=0, hits=0, spec=None) -> SchedulerStats:
    return SchedulerStats(running, waiting, usage, 10, 0, PrefixCacheStats(queries, hits), spec_decoding=spec)


def test_lines_over_an_interval():
    log = StatsLog()
    assert log.lines(100.0, 0, 0, stats()) == []  # the baseline
    assert log.lines(110.0, 0, 0, stats()) == []  # idle
    lines = log.lines(112.0, 1024, 96, stats(running=3, waiting=1, usage=0.041, queries=200, hits=50))
    assert lines == [
        "Engine 000: Avg prompt throughput: 512.0 tokens/s, Avg generation throughput: 48.0 tokens/s, "
        "Running: 3 reqs, Waiting: 1 reqs, KV cache usage: 4.1%, Prefix cache hit rate: 25.0%"
    ]
    # The hit rate is the interval's, not the total's.
    line = log.lines(114.0, 1024, 100, stats(running=1, queries=300, hits=150))[0]
    assert "Avg generation throughput: 2.0 tokens/s" in line and "Prefix cache hit rate: 100.0%" in line


def test_speculative_decoding_line():
    log = StatsLog("API server 1")
    log.lines(0.0, 0, 0, stats(spec=SpecDecodingStats(2, 6, 3, [2, 1, 0])))
    now = SpecDecodingStats(12, 36, 21, [10, 7, 4])
    lines = log.lines(10.0, 0, 40, stats(running=2, spec=now))
    assert lines[1] == (
        "API server 1: SpecDecoding metrics: Mean acceptance length: 2.80, Accepted throughput: 1.80 tokens/s, "
        "Drafted throughput: 3.00 tokens/s, Accepted: 18 tokens, Drafted: 30 tokens, "
        "Per-position acceptance rate: 0.800, 0.600, 0.400, Avg Draft acceptance rate: 60.0%"
    )
    assert len(log.lines(20.0, 0, 41, stats(running=1, spec=now))) == 1  # no drafts this interval


def test_a_server_logs_it(llama_dir, caplog):
    import time

    from starlette.testclient import TestClient

    from octavo import LLM
    from octavo.entrypoints.openai.app import build_app
    from octavo.entrypoints.openai.config import ServerConfig

    llm = LLM(str(llama_dir), dtype="float32", max_model_len=128, num_kv_blocks=32)
    caplog.set_level(logging.INFO, logger="octavo.stats")
    with TestClient(build_app(llm.engine, ServerConfig(served_model_names=["m"], log_stats_interval_s=0.05))) as client:
        body = {"model": "m", "prompt": [5, 6, 7, 8], "max_tokens": 6, "ignore_eos": True}
        assert client.post("/v1/completions", json=body).status_code == 200
        deadline = time.monotonic() + 30
        while "Avg generation throughput" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.02)
    assert "Engine 000: Avg prompt throughput" in caplog.text
    llm.engine.shutdown()


def test_disable_log_stats():
    from octavo.entrypoints.cli import serve
    from tests.entrypoints.server.test_serve_cli import parse

    assert serve.server_config_from(parse(["/m"])).log_stats_interval_s == 10.0
    assert serve.server_config_from(parse(["/m", "--disable-log-stats"])).log_stats_interval_s == 0.0
