"""Many clients at once: 200 concurrent streaming requests (completions, chat and responses,
through the async OpenAI client) all finish with exactly the tokens they asked for, while
/health stays 200."""

from __future__ import annotations

import asyncio


from tests.entrypoints.server.conftest import MODEL_NAME, async_openai, read_metrics, run_while_polling_health, wait_for

NUM_REQUESTS = 200


async def one_completion(client, index: int) -> tuple[int, int, str]:
    max_tokens = 1 + index % 4
    stream = await client.completions.create(
        model=MODEL_NAME, prompt=f"request {index}: once upon a time", max_tokens=max_tokens, temperature=0.7,
        seed=index, stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )
    finish_reasons, usage = [], None
    async for chunk in stream:
        finish_reasons += [c.finish_reason for c in chunk.choices if c.finish_reason]
        usage = chunk.usage or usage
    assert finish_reasons == ["length"]
    return max_tokens, usage.completion_tokens, "completion"


async def one_chat(client, index: int) -> tuple[int, int, str]:
    max_tokens = 1 + index % 4
    stream = await client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": f"hello {index}"}], max_tokens=max_tokens,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )
    finish_reasons, usage = [], None
    async for chunk in stream:
        finish_reasons += [c.finish_reason for c in chunk.choices if c.finish_reason]
        usage = chunk.usage or usage
    assert finish_reasons == ["length"]
    return max_tokens, usage.completion_tokens, "chat"


async def one_response(client, index: int) -> tuple[int, int, str]:
    max_tokens = 1 + index % 4
    stream = await client.responses.create(
        model=MODEL_NAME, input=f"hi {index}", max_output_tokens=max_tokens, stream=True, store=False,
        extra_body={"ignore_eos": True},
    )
    types, final = [], None
    async for event in stream:
        types.append(event.type)
        final = getattr(event, "response", None) or final
    assert types[0] == "response.created" and final.status == "incomplete"
    return max_tokens, final.usage.output_tokens, "response"


def test_200_concurrent_streams(server, auth_headers):
    kinds = (one_completion, one_chat, one_response)

    async def run_jobs():
        async with async_openai(server) as client:
            jobs = [kinds[i % 3](client, i) for i in range(NUM_REQUESTS)]
            return await asyncio.gather(*jobs)

    results, health_codes = run_while_polling_health(server.url, run_jobs)
    assert len(results) == NUM_REQUESTS
    for requested, received, kind in results:
        assert received == requested, kind
    assert health_codes and set(health_codes) == {200}
    wait_for(lambda: read_metrics(server, auth_headers)["octavo:num_inflight_sequences"] == 0)
    metrics = read_metrics(server, auth_headers)
    assert metrics["octavo:kv_cache_free_blocks"] == metrics["octavo:kv_cache_total_blocks"]
