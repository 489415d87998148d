"""Many pooling inputs admitted in one command (``AsyncEngine.add_pooling_batch``,
what ``/v1/embeddings`` and the other pooling routes use): a stream per input
with the vectors ``LLM`` gives, all admitted or none (a bad input, the
capacity), nothing left in the engine after a refusal; an engine that takes
no batches (no ``add_pooling_requests``) gets the inputs one by one."""

from __future__ import annotations

import asyncio

import pytest

from octavo import PoolingParams
from octavo.core.pooling_batch import PoolingBatch
from octavo.entrypoints.async_engine import AsyncEngine, AsyncEngineConfig
from octavo.errors import InvalidArgumentError, QueueFullError
from tests.models.conftest import pooling_dirs, wordpiece_dir  # noqa: F401

TIMEOUT_S = 120
IDS = [[2, 7, 9, 3], [2, 5, 3], [2, 11, 12, 13, 3]]


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, TIMEOUT_S))


def batch(token_ids: list[list[int]], prefix: str = "r") -> PoolingBatch:
    return PoolingBatch([f"{prefix}-{i}" for i in range(len(token_ids))], [None] * len(token_ids), token_ids,
                        [None] * len(token_ids))


@pytest.fixture
def llm(make_llm, pooling_dirs):  # noqa: F811
    return make_llm(pooling_dirs("bert"), max_model_len=64)


async def finals(engine: AsyncEngine, streams) -> list:
    outputs = []
    for stream in streams:
        async for output in engine.outputs(stream):
            if output.finished:
                outputs.append(output)
    return outputs


def test_a_batch_gives_the_vectors_of_llm(llm):
    expected = [o.outputs.raw for o in llm.embed([{"prompt_token_ids": ids} for ids in IDS])]

    async def main():
        engine = AsyncEngine(llm.engine, AsyncEngineConfig(max_inflight_seqs=8))
        engine.start()
        assert engine.takes_pooling_batches
        assert await engine.add_pooling_batch(batch([]), PoolingParams(task="embed")) == []  # nothing to send
        streams = await engine.add_pooling_batch(batch(IDS), PoolingParams(task="embed"))
        assert engine.num_inflight_seqs == len(IDS)
        outputs = await finals(engine, streams)
        for stream in streams:
            engine.close(stream)
        inflight = engine.num_inflight_seqs
        await engine.shutdown()
        return outputs, inflight

    outputs, inflight = run(main())
    assert [o.request_id for o in outputs] == ["r-0", "r-1", "r-2"]
    assert [o.outputs.raw for o in outputs] == expected
    assert inflight == 0


@pytest.mark.parametrize("bad, error", [
    ({"token_ids": [*IDS, [2, 10**6, 3]]}, InvalidArgumentError),  # out of the vocabulary: none is admitted
    ({"token_ids": IDS * 3}, QueueFullError),  # 9 inputs over a cap of 8
], ids=["bad-input", "over-capacity"])
def test_a_batch_is_admitted_whole_or_not_at_all(llm, bad, error):
    async def main():
        engine = AsyncEngine(llm.engine, AsyncEngineConfig(max_inflight_seqs=8))
        engine.start()
        with pytest.raises(error):
            await engine.add_pooling_batch(batch(bad["token_ids"]), PoolingParams(task="embed"))
        state = (engine.num_inflight_seqs, dict(engine._streams), (await engine.get_stats()).num_waiting)
        streams = await engine.add_pooling_batch(batch(IDS, "after"), PoolingParams(task="embed"))  # still serving
        outputs = await finals(engine, streams)
        await engine.shutdown()
        return state, outputs

    state, outputs = run(main())
    assert state == (0, {}, 0)
    assert len(outputs) == len(IDS)


def test_an_engine_without_batches_takes_the_inputs_one_by_one(llm):
    class OneByOne:  # an engine (a plugin's, say) without add_pooling_requests
        def __init__(self, engine):
            self._engine = engine

        def __getattr__(self, name):
            if name == "add_pooling_requests":
                raise AttributeError(name)
            return getattr(self._engine, name)

    async def main():
        engine = AsyncEngine(OneByOne(llm.engine))
        engine.start()
        takes = engine.takes_pooling_batches
        await engine.shutdown()
        return takes

    assert run(main()) is False
