"""Client disconnects abort their requests and free their KV blocks; /metrics tells the story."""

from __future__ import annotations

import asyncio

import httpx

from tests.entrypoints.server.conftest import MAX_MODEL_LEN, MODEL_NAME, async_openai, read_metrics, wait_for

LONG = {"max_tokens": MAX_MODEL_LEN - 100, "temperature": 0, "extra_body": {"ignore_eos": True}}


def idle_snapshot(server, headers):
    def idle():
        metrics = read_metrics(server, headers)
        if metrics["octavo:num_inflight_sequences"] == 0 and metrics["octavo:num_requests_running"] == 0:
            return metrics
        return None

    return wait_for(idle)


def test_metrics_cover_the_documented_series(server, auth_headers, openai_client):
    openai_client.completions.create(model=MODEL_NAME, prompt="Once upon a time", max_tokens=4, temperature=0)
    metrics = read_metrics(server, auth_headers)
    for name in (
        "octavo:num_requests_running", "octavo:num_requests_waiting", "octavo:kv_cache_usage_perc",
        "octavo:kv_cache_free_blocks", "octavo:prefix_cache_hit_rate", "octavo:num_preemptions_total",
        "octavo:prompt_tokens_total", "octavo:generation_tokens_total", "octavo:time_to_first_token_seconds_count",
        "octavo:inter_token_latency_seconds_count", "octavo:e2e_request_latency_seconds_count", "octavo:engine_alive",
        "octavo:compilations_total", "octavo:compilations_after_warmup_total",
    ):
        assert name in metrics, name
    assert metrics["octavo:generation_tokens_total"] >= 4
    assert metrics["octavo:time_to_first_token_seconds_count"] >= 1
    assert metrics["octavo:engine_alive"] == 1


def test_token_counters_add_up(server, auth_headers, openai_client):
    before = idle_snapshot(server, auth_headers)
    response = openai_client.completions.create(
        model=MODEL_NAME, prompt=["a b c", "the fox"], n=2, max_tokens=5, temperature=0, extra_body={"ignore_eos": True}
    )
    after = idle_snapshot(server, auth_headers)
    assert after["octavo:generation_tokens_total"] - before["octavo:generation_tokens_total"] == 20
    assert after["octavo:prompt_tokens_total"] - before["octavo:prompt_tokens_total"] == response.usage.prompt_tokens
    finished = "octavo:request_success_total{finished_reason=length}"
    assert after[finished] - before.get(finished, 0) == 4
    assert after["octavo:e2e_request_latency_seconds_count"] - before["octavo:e2e_request_latency_seconds_count"] == 2
    assert after["octavo:time_to_first_token_seconds_count"] - before["octavo:time_to_first_token_seconds_count"] == 2

    stream = openai_client.completions.create(
        model=MODEL_NAME, prompt="a b c", max_tokens=5, temperature=0, stream=True, extra_body={"ignore_eos": True}
    )
    assert sum(1 for _ in stream) >= 1
    streamed = idle_snapshot(server, auth_headers)
    itl = "octavo:inter_token_latency_seconds_count"
    assert streamed[itl] - after[itl] == 4  # five tokens, four gaps


def test_disconnects_abort_and_free_blocks(server, auth_headers, openai_client):
    baseline = idle_snapshot(server, auth_headers)
    assert baseline["octavo:kv_cache_free_blocks"] == baseline["octavo:kv_cache_total_blocks"]
    aborted_key = "octavo:request_success_total{finished_reason=abort}"

    # 1. A streaming completion and a streaming chat, closed after two chunks.
    stream = openai_client.completions.create(model=MODEL_NAME, prompt="Once upon a time", stream=True, **LONG)
    chunks = [next(iter(stream)) for _ in range(2)]
    assert all(chunk.choices[0].finish_reason is None for chunk in chunks)
    chat = openai_client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], stream=True, n=2, **LONG
    )
    next(iter(chat)), next(iter(chat))
    busy = read_metrics(server, auth_headers)
    assert busy["octavo:kv_cache_free_blocks"] < baseline["octavo:kv_cache_free_blocks"]
    stream.close()
    chat.close()
    wait_for(lambda: read_metrics(server, auth_headers)["octavo:num_inflight_sequences"] == 0)

    # 2. A non-streaming request whose client gives up (its task is cancelled, closing the connection).
    async def abandon_non_streaming():
        async with async_openai(server) as client:
            task = asyncio.create_task(client.completions.create(model=MODEL_NAME, prompt="the fox", **LONG))
            await asyncio.to_thread(
                wait_for, lambda: read_metrics(server, auth_headers)["octavo:num_inflight_sequences"] >= 1
            )
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(abandon_non_streaming())

    idle_snapshot(server, auth_headers)
    # The stats come from the engine thread, which applies an abort before it answers.
    after = read_metrics(server, auth_headers)
    assert after["octavo:kv_cache_free_blocks"] == baseline["octavo:kv_cache_free_blocks"]
    assert after["octavo:num_requests_running"] == 0 and after["octavo:num_requests_waiting"] == 0
    # Three requests were aborted (not finished): the chat's n=2 counts once, as one request.
    assert after.get(aborted_key, 0) - baseline.get(aborted_key, 0) == 3


def test_raw_stream_disconnect_before_first_token(server, auth_headers):
    """Closing a raw HTTP stream right after the headers also aborts the request."""
    baseline = idle_snapshot(server, auth_headers)
    body = {"model": MODEL_NAME, "prompt": "hello", "stream": True, "max_tokens": MAX_MODEL_LEN - 100, "ignore_eos": True}
    with httpx.Client(base_url=server.url, headers=auth_headers, timeout=60) as client:
        with client.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
    wait_for(lambda: read_metrics(server, auth_headers)["octavo:num_inflight_sequences"] == 0)
    after = idle_snapshot(server, auth_headers)
    assert after["octavo:kv_cache_free_blocks"] == baseline["octavo:kv_cache_free_blocks"]
