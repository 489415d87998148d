"""``octavo serve --api-server-count 2``: two API processes share the port in
front of one engine process; requests go through both, /metrics from either
one counts all of them (speculative decoding's counters included), every KV
block comes back, SIGTERM stops everything."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from tests.entrypoints.server.conftest import read_metrics, wait_for
from tests.entrypoints.server.server_process import ServerProcess

API_KEY = "multi-key"
NUM_REQUESTS = 48


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


async def stream_all(url: str) -> list[int]:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    # A connection per request: the kernel spreads new connections over the two listeners.
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300, limits=httpx.Limits(max_keepalive_connections=0)) as client:

        async def one(index: int) -> int:
            body = {"prompt": f"story {index}:", "max_tokens": 1 + index % 3, "stream": True, "ignore_eos": True,
                    "stream_options": {"include_usage": True}}
            completion_tokens = 0
            async with client.stream("POST", "/v1/completions", json=body) as response:
                assert response.status_code == 200
                async for line in response.aiter_lines():
                    if line.startswith("data: {") and '"usage"' in line and '"completion_tokens"' in line:
                        completion_tokens = int(line.split('"completion_tokens":')[1].split(",")[0].split("}")[0])
            return completion_tokens

        return await asyncio.gather(*(one(i) for i in range(NUM_REQUESTS)))


def test_two_api_processes_serve_one_engine(llama_dir, tmp_path):
    # With n-gram speculation on: its counters come from the engine's snapshot, once, in either process's answer.
    speculative = '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1, "prompt_lookup_max": 2}'
    server = ServerProcess(
        llama_dir, ["--api-server-count", "2", "--max-model-len", "512", "--num-kv-blocks", "256", "--api-key", API_KEY,
                    "--speculative-config", speculative],
        tmp_path / "server.log",
    )
    try:
        server.wait_healthy()
        processes = descendants(server.process.pid)
        assert len(processes) >= 3  # two API processes and the engine process
        tokens = asyncio.run(stream_all(server.url))
        assert tokens == [1 + i % 3 for i in range(NUM_REQUESTS)]
        headers = {"Authorization": f"Bearer {API_KEY}"}
        wait_for(lambda: read_metrics(server, headers)["octavo:num_inflight_sequences"] == 0)
        metrics = read_metrics(server, headers)
        per_process = [metrics.get(f'octavo:api_server_requests_total{{api_server={i}}}', 0) for i in (0, 1)]
        assert all(n > 0 for n in per_process) and sum(per_process) == NUM_REQUESTS
        assert metrics["octavo:request_success_total{finished_reason=length}"] == NUM_REQUESTS
        assert metrics["octavo:generation_tokens_total"] == sum(tokens)
        assert metrics["octavo:kv_cache_free_blocks"] == metrics["octavo:kv_cache_total_blocks"] == 256
        drafted, accepted = (metrics[f"octavo:spec_decode_num_{name}_total"] for name in ("draft_tokens", "accepted_tokens"))
        assert 0 <= accepted <= drafted
        # A stored response would live in one process only: none is stored, and asking for it is a 400.
        body = {"input": "Once upon a time", "max_output_tokens": 2}
        assert httpx.post(f"{server.url}/v1/responses", json=body, headers=headers, timeout=60).json()["store"] is False
        refused = httpx.post(f"{server.url}/v1/responses", json={**body, "store": True}, headers=headers, timeout=60)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "store"
    finally:
        server.terminate()
        status = server.wait(timeout=120)
        server.stop()
    assert status == 0, server.log()
    deadline = time.monotonic() + 30  # the launcher waits for its children; stragglers get this long
    while _alive(processes) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(processes), _alive(processes)


def _alive(pids: set[int]) -> dict[int, str]:
    """The pids still running (not exited, not zombies), with their command lines."""
    alive = {}
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0]
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "zombie" not in state.lower():
            alive[pid] = command
    return alive
