"""Two engine replicas in their own processes behind ``DataParallelEngine``:
the same tokens as one engine, work on both, prefix-cache affinity, abort,
stats, and a dead replica reported as ``EngineDeadError``.

One engine serves the whole module (each replica costs a process start);
the replica-death test runs last and kills it.
"""

from __future__ import annotations

import os
import signal

import pytest

from octavo import LLM, SamplingParams
from octavo.distributed.data_parallel import DataParallelEngine
from octavo.errors import EngineDeadError, InvalidArgumentError, PromptTooLongError
from tests.distributed.common import (
    assert_same_tokens_and_logprobs,
    engine_options,
    generate,
    greedy,
    make_prompts,
    reference,
    vocab_size,
)


@pytest.fixture(scope="module")
def dp_llm(llama_dir):
    llm = LLM(str(llama_dir), **engine_options(data_parallel_size=2))
    yield llm
    llm.engine.shutdown()


def drain(engine) -> dict:
    finished = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output
    return finished


def test_same_tokens_as_one_engine_and_both_replicas_serve(dp_llm, llama_dir):
    engine = dp_llm.engine
    assert isinstance(engine, DataParallelEngine) and engine.num_replicas == 2
    prompts = make_prompts(vocab_size(llama_dir), seed=3)
    expected = reference(llama_dir, prompts, greedy(logprobs=1))
    assert_same_tokens_and_logprobs(generate(dp_llm, prompts, greedy(logprobs=1)), expected)
    assert all(load.num_routed > 0 for load in engine.router.loads)
    assert all(load.num_requests == 0 and load.num_tokens == 0 for load in engine.router.loads)


def test_shared_prefix_goes_to_the_replica_that_cached_it(dp_llm):
    engine = dp_llm.engine
    shared = list(range(10, 58))  # three full blocks
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    first = engine.add_request(None, shared + [5, 6, 7], params)
    owner = engine.router.replica_of(first)
    drain(engine)  # the prefix is now in the owner's cache

    # Make the owner the busier replica, then send another prompt with the prefix.
    busy = engine.add_request(None, [9] * 20, params)
    assert engine.router.replica_of(busy) == owner
    second = engine.add_request(None, shared + [8, 9], params)
    other = engine.add_request(None, [11] * 30, params)
    assert engine.router.replica_of(second) == owner  # affinity beat the lighter load
    assert engine.router.replica_of(other) != owner
    finished = drain(engine)
    assert finished[second].num_cached_tokens == 48
    owner_stats = engine.get_replica_stats()[owner]
    assert owner_stats.prefix_cache.num_hits >= 48
    assert engine.get_stats().prefix_cache.num_hits == sum(s.prefix_cache.num_hits for s in engine.get_replica_stats())


def test_bad_input_and_abort(dp_llm):
    engine = dp_llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=250, ignore_eos=True)
    with pytest.raises(PromptTooLongError):
        engine.add_request(None, [5] * 300, params)
    # The front cuts the prompt before its checks; the replica gets the cut prompt.
    cut = engine.add_request(None, list(range(1, 301)), SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True,
                                                                    truncate_prompt_tokens=20))
    assert drain(engine)[cut].prompt_token_ids == list(range(281, 301))
    engine.add_request("keep", [5, 6, 7], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    with pytest.raises(InvalidArgumentError, match="already in use"):
        engine.add_request("keep", [5, 6, 7], params)
    engine.add_request("long", [5, 6, 7, 8], params)
    finished = {o.request_id: o for o in engine.step() if o.finished}
    engine.abort_request("long")
    finished.update(drain(engine))
    assert "long" not in finished and finished["keep"].outputs[0].finish_reason == "length"
    stats = engine.get_stats()
    assert stats.num_running == 0 and stats.num_waiting == 0


def test_a_burst_of_requests_all_complete(dp_llm):
    # Adds keep coming while replicas stream outputs back: neither side's
    # sends may wait on the other (replicas read their pipe on a thread).
    engine = dp_llm.engine
    before = [load.num_routed for load in engine.router.loads]
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, logprobs=5)
    ids = [engine.add_request(None, [5 + i % 200] * (1 + i % 40), params) for i in range(100)]
    finished = drain(engine)
    assert sorted(finished) == sorted(ids)
    assert all(len(finished[i].outputs[0].token_ids) == 3 for i in ids)
    assert all(load.num_routed - b >= 30 for load, b in zip(engine.router.loads, before))


def test_dead_replica_fails_requests(dp_llm):
    engine = dp_llm.engine
    engine.check_health()
    params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
    ids = [engine.add_request(None, [5, 6, 7 + i], params) for i in range(4)]
    victim = engine._replicas[1].process
    os.kill(victim.pid, signal.SIGKILL)
    with pytest.raises(EngineDeadError, match="replica 1 died") as info:
        drain(engine)
    assert sorted(info.value.failed_request_ids) == sorted(ids)
    with pytest.raises(EngineDeadError):
        engine.check_health()
    assert not engine.has_unfinished_requests()
    for replica in engine._replicas:
        replica.process.join(10)
        assert not replica.process.is_alive()
