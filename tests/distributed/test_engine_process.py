"""``engine_process=True`` (``--engine-process``): one engine in a process of
its own, behind the ``DataParallelEngine`` front with one replica. The same
tokens and logprobs as the in-process engine; stats come from the replica."""

from __future__ import annotations

import os

from octavo import LLM
from octavo.distributed.data_parallel import DataParallelEngine
from octavo.entrypoints.engine_stats import engine_capacity, is_data_parallel, take_snapshot
from tests.distributed.common import engine_options, generate, greedy, make_prompts, reference, token_ids, vocab_size


def test_engine_in_its_own_process_gives_the_same_tokens(llama_dir):
    llm = LLM(str(llama_dir), **engine_options(engine_process=True))
    try:
        engine = llm.engine
        assert isinstance(engine, DataParallelEngine) and engine.num_replicas == 1
        assert engine._replicas[0].process.pid != os.getpid()
        prompts = make_prompts(vocab_size(llama_dir), seed=5)
        expected = reference(llama_dir, prompts, greedy(logprobs=1))
        outputs = generate(llm, prompts, greedy(logprobs=1))
        assert token_ids(outputs) == token_ids(expected)
        for output, ref in zip(outputs, expected):
            got, want = output.outputs[0].logprobs, ref.outputs[0].logprobs
            assert all(abs(g[t].logprob - w[t].logprob) < 1e-5 for g, w in zip(got, want) for t in w)
        # The server's stats path: the replica's numbers, not this process's.
        assert is_data_parallel(engine)
        capacity = engine_capacity(engine)
        assert (capacity.num_replicas, capacity.num_kv_blocks) == (1, engine.num_kv_blocks)
        snapshot = take_snapshot(engine)
        assert len(snapshot.replicas) == 1 and snapshot.replicas[0].num_requests_finished == len(prompts)
        assert snapshot.stats.num_running == 0 and snapshot.stats.num_free_blocks == engine.num_kv_blocks
    finally:
        llm.engine.shutdown()
