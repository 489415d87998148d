"""Issue 14, item 1, in-process (no HTTP): a failure that belongs to one request (adding it,
turning its tokens into output) fails that request only and the engine goes on; a death
fails even an admission in progress at once; a restarter brings a new engine in; and an
engine process's replica contains a failed add the same way."""

from __future__ import annotations

import asyncio

import pytest

from octavo import LLM, SamplingParams
from octavo.core.sampling_params import RequestOutputKind
from octavo.entrypoints.async_engine import AsyncEngine, RequestFailedError
from octavo.entrypoints.engine_restart import EngineRestarter, RestartPolicy
from octavo.errors import EngineDeadError

TIMEOUT_S = 120


def delta(**options) -> SamplingParams:
    return SamplingParams(output_kind=RequestOutputKind.DELTA, temperature=0, **options)


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, TIMEOUT_S))


def tiny_llm(llama_dir) -> LLM:
    return LLM(str(llama_dir), dtype="float32", max_model_len=256, num_kv_blocks=256)


async def text_of(engine: AsyncEngine, request_id: str, params: SamplingParams) -> str:
    return "".join([o.outputs[0].text async for o in engine.generate(request_id, "hello", params)])


@pytest.fixture
def llm(make_llm, llama_dir):
    return make_llm(llama_dir, num_kv_blocks=256)


def test_a_request_that_cannot_be_added_fails_alone(llm):
    add_request = llm.engine.add_request

    def add_or_overflow(request_id, prompt, params, *rest, **options):
        if request_id == "bad":  # what msgpack raises for an integer it cannot pack
            raise OverflowError("Integer value out of range")
        return add_request(request_id, prompt, params, *rest, **options)

    llm.engine.add_request = add_or_overflow

    async def main():
        engine = AsyncEngine(llm.engine)
        engine.start()
        with pytest.raises(RequestFailedError, match="OverflowError"):
            await engine.add_request("bad", "hello", delta(max_tokens=4))
        text = await text_of(engine, "good", delta(max_tokens=4))
        alive = engine.is_alive
        await engine.shutdown()
        return text, alive

    text, alive = run(main())
    assert alive and text == llm.generate("hello", SamplingParams(temperature=0, max_tokens=4))[0].outputs[0].text


def test_a_request_whose_output_fails_fails_alone(llm):
    processor = llm.engine.output_processor
    process_one = processor._process_one

    def process_or_fail(core_output, now):
        if core_output.request_id.startswith("bad"):
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "a detokenizer bug")
        return process_one(core_output, now)

    processor._process_one = process_or_fail

    async def main():
        engine = AsyncEngine(llm.engine)
        engine.start()
        results = await asyncio.gather(
            text_of(engine, "bad", delta(max_tokens=50, ignore_eos=True, n=2)),
            text_of(engine, "good", delta(max_tokens=50, ignore_eos=True)),
            return_exceptions=True,
        )
        stats = await engine.get_stats()
        alive = engine.is_alive
        await engine.shutdown()
        return results, stats, alive

    (bad, good), stats, alive = run(main())
    assert isinstance(bad, RequestFailedError) and isinstance(good, str) and good
    assert alive and stats.num_running == stats.num_waiting == 0  # make_llm checks every block came back


def test_a_death_while_adding_fails_the_admission_at_once(llm):
    def dead(*args, **kwargs):
        raise EngineDeadError("the engine process is gone")

    llm.engine.add_request = dead

    async def main():
        engine = AsyncEngine(llm.engine)
        engine.start()
        with pytest.raises(EngineDeadError):
            await engine.add_request("r", "hello", delta(max_tokens=4))
        await asyncio.sleep(0)  # the loop has heard of the death
        with pytest.raises(EngineDeadError):
            await engine.add_request("later", "hello", delta(max_tokens=4))
        alive = engine.is_alive
        await engine.shutdown()
        return alive

    assert run(main()) is False


class Observer:
    def __init__(self) -> None:
        self.num_restarts = 0

    def on_request_added(self, *args) -> None:
        raise RuntimeError("a metrics bug must not stop the engine")

    def on_outputs(self, outputs) -> None:
        pass

    def on_request_aborted(self, request_id) -> None:
        pass

    def on_engine_restarted(self) -> None:
        self.num_restarts += 1


def test_a_dead_engine_is_restarted(llama_dir):
    first = tiny_llm(llama_dir)

    def broken(scheduler_output):
        raise RuntimeError("boom")

    first.engine.executor.execute_model = broken
    built = []

    def factory():
        built.append(tiny_llm(llama_dir))
        return built[-1].engine

    observer = Observer()

    async def main():
        engine = AsyncEngine(first.engine, observer=observer, restarter=EngineRestarter(factory, RestartPolicy()))
        engine.start()
        with pytest.raises(EngineDeadError, match="RuntimeError: boom; it is restarting"):
            await text_of(engine, "r1", delta(max_tokens=4))
        while not engine.is_alive:
            await asyncio.sleep(0.01)
        text = await text_of(engine, "r2", delta(max_tokens=4))
        await engine.shutdown()
        return text

    text = run(main())
    assert observer.num_restarts == 1 and len(built) == 1
    # The failed engine is never used again; the same checkpoint in a fresh one gives the reference.
    assert text == built[0].generate("hello", SamplingParams(temperature=0, max_tokens=4))[0].outputs[0].text


def test_a_replica_contains_a_failed_add():
    from octavo.distributed.dp_replica import ReplicaServer
    from octavo.distributed.serialization import decode

    class Engine:
        def add_request(self, *args):
            raise OverflowError("Integer value out of range")

    class Outbox:
        def __init__(self) -> None:
            self.sent = []

        def send(self, data: bytes) -> None:
            self.sent.append(decode(data))

    outbox = Outbox()
    server = ReplicaServer.__new__(ReplicaServer)
    server.engine, server.outboxes, server.owner = Engine(), [outbox], {}
    assert server.handle(0, ["add", "r1", {"prompt": "hi"}, SamplingParams(), None, 0, None]) is True
    assert outbox.sent == [["add_failed", "r1", "OverflowError", "Integer value out of range"]]
