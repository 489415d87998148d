"""``octavo serve --data-parallel-size 2``: two engine replicas (two processes) behind one server.

Greedy output equals the single engine's; 200 concurrent streams all finish with /health at 200
and both replicas serve some (per-replica counters in /metrics, label ``replica``); requests
sharing a long prefix go to the replica that cached it and hit its cache; a disconnect frees the
blocks in the replica that held the request; killing a replica fails the streams in flight and
turns /health to 503. One server serves the module; the kill test runs last.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal

import httpx
import openai
import pytest

from octavo import SamplingParams
from tests.entrypoints.server.conftest import read_metrics, run_while_polling_health, wait_for
from tests.entrypoints.server.server_process import ServerProcess

MODEL = "tiny-llama-dp"
NUM_KV_BLOCKS = 1024  # per replica
MAX_MODEL_LEN = 2048
NUM_STREAMS = 200
REPLICAS = ("0", "1")
LONG = {"max_tokens": MAX_MODEL_LEN - 100, "temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def dp_server(llama_dir, tmp_path_factory):
    args = ["--data-parallel-size", "2", "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "128",
            "--num-kv-blocks", str(NUM_KV_BLOCKS), "--served-model-name", MODEL]
    process = ServerProcess(llama_dir, args, tmp_path_factory.mktemp("dp-server") / "server.log")
    process.wait_healthy()
    yield process
    process.stop()


def client(server: ServerProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)


def per_replica(metrics: dict[str, float], name: str) -> dict[str, float]:
    return {r: metrics.get(f"octavo:{name}{{replica={r}}}", 0.0) for r in REPLICAS}


def idle_metrics(server: ServerProcess) -> dict[str, float]:
    def idle():
        metrics = read_metrics(server)
        running = per_replica(metrics, "replica_num_requests_running")
        if metrics["octavo:num_inflight_sequences"] == 0 and not any(running.values()):
            return metrics
        return None

    return wait_for(idle)


def test_greedy_output_equals_one_engine(dp_server, reference_llm):
    prompts = ["Once upon a time", "The fox walked to the river", "Octavo is", "a b c d e f", "hello", "river"]
    expected = [o.outputs[0] for o in reference_llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12))]
    before = idle_metrics(dp_server)

    async def main():
        async with client(dp_server) as c:
            jobs = [c.completions.create(model=MODEL, prompt=p, max_tokens=12, temperature=0) for p in prompts]
            return await asyncio.gather(*jobs)

    responses = asyncio.run(main())
    for response, reference in zip(responses, expected):
        assert response.choices[0].text == reference.text
        assert response.choices[0].finish_reason == reference.finish_reason
        assert response.usage.completion_tokens == len(reference.token_ids)
    after = idle_metrics(dp_server)
    served = per_replica(after, "replica_requests_finished_total")
    served_before = per_replica(before, "replica_requests_finished_total")
    assert all(served[r] > served_before[r] for r in REPLICAS)  # both replicas took part


async def one_stream(c: openai.AsyncOpenAI, index: int) -> tuple[int, int]:
    max_tokens = 1 + index % 4
    if index % 2:
        stream = await c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"hello {index}"}], max_tokens=max_tokens, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )
    else:
        stream = await c.completions.create(
            model=MODEL, prompt=f"request {index}: once upon a time", max_tokens=max_tokens, temperature=0.7,
            seed=index, stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )
    finish_reasons, usage = [], None
    async for chunk in stream:
        finish_reasons += [choice.finish_reason for choice in chunk.choices if choice.finish_reason]
        usage = chunk.usage or usage
    assert finish_reasons == ["length"]
    return max_tokens, usage.completion_tokens


def test_200_concurrent_streams_both_replicas_serve(dp_server):
    before = idle_metrics(dp_server)

    async def run_jobs():
        async with client(dp_server) as c:
            return await asyncio.gather(*(one_stream(c, i) for i in range(NUM_STREAMS)))

    results, health_codes = run_while_polling_health(dp_server.url, run_jobs)
    assert len(results) == NUM_STREAMS
    assert all(received == requested for requested, received in results)
    assert health_codes and set(health_codes) == {200}

    after = idle_metrics(dp_server)
    finished = per_replica(after, "replica_requests_finished_total")
    finished_before = per_replica(before, "replica_requests_finished_total")
    served = {r: finished[r] - finished_before[r] for r in REPLICAS}
    assert all(served[r] > 0 for r in REPLICAS), served
    assert sum(served.values()) == NUM_STREAMS
    routed = per_replica(after, "replica_requests_routed_total")
    assert routed == finished  # nothing lost or left behind
    # Every block is back in its replica's pool; the unlabelled totals are the sums.
    assert per_replica(after, "replica_kv_cache_free_blocks") == {r: NUM_KV_BLOCKS for r in REPLICAS}
    assert after["octavo:kv_cache_free_blocks"] == after["octavo:kv_cache_total_blocks"] == 2 * NUM_KV_BLOCKS


def test_shared_prefix_goes_to_the_replica_that_cached_it(dp_server):
    shared = list(range(10, 10 + 6 * 16))  # six full KV blocks

    async def send(prompts):
        async with client(dp_server) as c:
            jobs = [c.completions.create(model=MODEL, prompt=p, max_tokens=2, temperature=0) for p in prompts]
            return await asyncio.gather(*jobs)

    before = idle_metrics(dp_server)
    asyncio.run(send([shared + [300, 301]]))
    first = idle_metrics(dp_server)
    routed_before, routed = per_replica(before, "replica_requests_routed_total"), per_replica(first, "replica_requests_routed_total")
    owner = next(r for r in REPLICAS if routed[r] > routed_before[r])
    other = next(r for r in REPLICAS if r != owner)

    # Four at once: affinity keeps them on the owner although that makes it the busier replica.
    asyncio.run(send([shared + [310 + i, 320 + i] for i in range(4)]))
    after = idle_metrics(dp_server)
    routed_after = per_replica(after, "replica_requests_routed_total")
    assert routed_after[owner] - routed[owner] == 4 and routed_after[other] == routed[other]
    hits = per_replica(after, "replica_prefix_cache_hits_total")
    hits_before = per_replica(first, "replica_prefix_cache_hits_total")
    assert hits[owner] - hits_before[owner] >= 4 * len(shared)
    assert hits[other] == hits_before[other]
    assert after["octavo:prefix_cache_hits_total"] - first["octavo:prefix_cache_hits_total"] >= 4 * len(shared)


def test_disconnect_frees_the_blocks_of_the_replica_that_held_the_request(dp_server):
    before = idle_metrics(dp_server)
    aborted = "octavo:request_success_total{finished_reason=abort}"

    async def main():
        async with client(dp_server) as c:
            stream = await c.completions.create(model=MODEL, prompt="Once upon a time", stream=True, **LONG)
            chunks = [await stream.__anext__() for _ in range(2)]
            busy = read_metrics(dp_server)
            await stream.close()
            return chunks, busy

    chunks, busy = asyncio.run(main())
    assert all(chunk.choices[0].finish_reason is None for chunk in chunks)
    free = per_replica(busy, "replica_kv_cache_free_blocks")
    holder = next(r for r in REPLICAS if free[r] < NUM_KV_BLOCKS)
    assert per_replica(busy, "replica_num_requests_running")[holder] == 1
    after = idle_metrics(dp_server)
    assert per_replica(after, "replica_kv_cache_free_blocks") == {r: NUM_KV_BLOCKS for r in REPLICAS}
    assert after.get(aborted, 0) - before.get(aborted, 0) == 1


def replica_pids(server: ServerProcess) -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"engine replica (\d+) started in its own process \(pid (\d+)\)", server.log())}


async def stream_until_error(c: openai.AsyncOpenAI, index: int, started: asyncio.Event) -> tuple[int, Exception | None]:
    num_chunks = 0
    try:
        # Shorter than one KV block: no prefix affinity, so the requests spread over both replicas.
        stream = await c.completions.create(model=MODEL, prompt=f"{index} once", stream=True, **LONG)
        async for _ in stream:
            num_chunks += 1
            started.set()
    except openai.APIError as exc:
        return num_chunks, exc
    return num_chunks, None


def test_killing_a_replica_fails_requests_in_flight_and_health(dp_server):
    pids = replica_pids(dp_server)
    assert sorted(pids) == list(REPLICAS)

    async def main():
        async with client(dp_server) as c:
            events = [asyncio.Event() for _ in range(4)]
            readers = [asyncio.create_task(stream_until_error(c, i, event)) for i, event in enumerate(events)]
            for event in events:
                await event.wait()
            await asyncio.to_thread(wait_for, lambda: all(per_replica(read_metrics(dp_server), "replica_num_requests_running").values()))
            os.kill(pids["1"], signal.SIGKILL)
            return await asyncio.gather(*readers)

    results = asyncio.run(asyncio.wait_for(main(), 120))
    dead = "the engine loop failed: EngineDeadError: data-parallel replica 1 died (exit code -9)"
    for num_chunks, error in results:  # every stream, on either replica, ends with the error
        assert num_chunks >= 1
        assert error is not None and str(error) == dead
    health = httpx.get(f"{dp_server.url}/health", timeout=60)
    assert health.status_code == 503 and health.json()["error"]["message"] == dead
    refused = httpx.post(f"{dp_server.url}/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2}, timeout=60)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_dead"
    assert read_metrics(dp_server)["octavo:engine_alive"] == 0
    # The surviving replica was shut down too: no process is left behind.
    wait_for(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in pids.values()))
