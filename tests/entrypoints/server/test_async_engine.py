"""The async engine in-process (no HTTP): streaming with n > 1, aborts that free KV blocks,
admission limits, and an engine-loop failure that ends every stream instead of hanging."""

from __future__ import annotations

import asyncio

import pytest

from octavo import LLM, SamplingParams
from octavo.core.sampling_params import RequestOutputKind
from octavo.entrypoints.async_engine import AsyncEngine, AsyncEngineConfig, ServerShuttingDownError
from octavo.errors import EngineDeadError, InvalidArgumentError, QueueFullError

# Every await is bounded, so a bug shows up as a failure instead of a hung suite.
TIMEOUT_S = 120


def delta(**options) -> SamplingParams:
    return SamplingParams(output_kind=RequestOutputKind.DELTA, **options)


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, TIMEOUT_S))


@pytest.fixture
def llm(make_llm, llama_dir):
    return make_llm(llama_dir, num_kv_blocks=256)


def test_streams_n_choices_token_by_token(llm):
    expected = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=8))[0].outputs[0]

    async def main():
        engine = AsyncEngine(llm.engine)
        engine.start()
        texts, tokens, num_outputs = {0: "", 1: "", 2: ""}, {0: [], 1: [], 2: []}, 0
        async for output in engine.generate("r1", "Once upon a time", delta(n=3, temperature=0, max_tokens=8)):
            num_outputs += 1
            for completion in output.outputs:
                texts[completion.index] += completion.text
                tokens[completion.index] += completion.token_ids
        await engine.shutdown()
        return texts, tokens, num_outputs

    texts, tokens, num_outputs = run(main())
    assert texts == {0: expected.text, 1: expected.text, 2: expected.text}
    assert all(ids == list(expected.token_ids) for ids in tokens.values())  # each token once, in order
    # Streamed in pieces; how many depends on how fast the consumer reads (deltas
    # a slow reader has not taken yet are merged), so not one per step for sure.
    assert num_outputs >= 2


def test_closing_a_stream_aborts_and_frees_blocks(llm):
    async def main():
        engine = AsyncEngine(llm.engine)
        engine.start()
        baseline = (await engine.get_stats()).num_free_blocks
        params = delta(temperature=0, max_tokens=200, ignore_eos=True)
        stream = engine.generate("long", "Once upon a time", params)
        await stream.__anext__()
        await stream.__anext__()
        busy = await engine.get_stats()
        await stream.aclose()
        # The abort was queued before this stats request, so the engine thread has applied it.
        after = await engine.get_stats()
        await engine.shutdown()
        return baseline, busy, after, engine.num_inflight_seqs

    baseline, busy, after, num_inflight = run(main())
    assert busy.num_free_blocks < baseline
    assert after.num_free_blocks == baseline
    assert after.num_running == after.num_waiting == 0
    assert num_inflight == 0


def test_admission_is_bounded(llm):
    async def main():
        engine = AsyncEngine(llm.engine, AsyncEngineConfig(max_inflight_seqs=2))
        engine.start()
        params = delta(temperature=0, max_tokens=100, ignore_eos=True)
        held = await engine.add_request("a", "hello", params)
        with pytest.raises(QueueFullError):
            await engine.add_request("b", "hello", delta(n=2, max_tokens=4))
        second = await engine.add_request("c", "hello", params)
        engine.close(held)
        engine.close(second)
        third = [o async for o in engine.generate("d", "hello", delta(n=2, max_tokens=2))]
        await engine.shutdown()
        return third

    outputs = run(main())
    assert outputs[-1].finished


def test_invalid_request_raises_before_scheduling(llm):
    async def main():
        engine = AsyncEngine(llm.engine)
        engine.start()
        with pytest.raises(InvalidArgumentError, match="out of range"):
            await engine.add_request("bad", [10**6], delta())
        stats = await engine.get_stats()
        await engine.shutdown()
        return stats, engine.num_inflight_seqs

    stats, num_inflight = run(main())
    assert stats.num_waiting == stats.num_running == 0 and num_inflight == 0


def test_engine_failure_ends_every_stream(llama_dir):
    llm = LLM(str(llama_dir), dtype="float32", max_model_len=256, num_kv_blocks=256)
    execute_model = llm.engine.executor.execute_model
    num_steps = 0

    def flaky(scheduler_output):
        nonlocal num_steps
        num_steps += 1
        if num_steps > 5:
            raise RuntimeError("boom")
        return execute_model(scheduler_output)

    llm.engine.executor.execute_model = flaky

    async def consume(engine, request_id):
        received = 0
        try:
            async for output in engine.generate(request_id, "hello", delta(max_tokens=100, ignore_eos=True)):
                received += len(output.outputs[0].token_ids)
        except EngineDeadError as exc:
            return received, exc
        return received, None

    async def main():
        engine = AsyncEngine(llm.engine)
        engine.start()
        results = await asyncio.gather(*(consume(engine, f"r{i}") for i in range(4)))
        with pytest.raises(EngineDeadError):
            await engine.add_request("late", "hello", delta())
        stats = await engine.get_stats()  # the last known stats, not a hang
        alive = engine.is_alive
        await engine.shutdown()
        return results, stats, alive

    results, stats, alive = run(main())
    assert not alive and stats is not None
    for received, error in results:
        assert error is not None and "RuntimeError: boom" in error.message
        assert received < 100


def test_shutdown_fails_streams_in_flight(llm):
    async def main():
        engine = AsyncEngine(llm.engine)
        engine.start()
        stream = await engine.add_request("s", "hello", delta(max_tokens=200, ignore_eos=True))
        outputs = engine.outputs(stream)
        await outputs.__anext__()
        await engine.shutdown()
        with pytest.raises(ServerShuttingDownError):
            async for _ in outputs:
                pass
        return llm.engine.get_stats()

    stats = run(main())
    assert stats.num_running == stats.num_waiting == 0
