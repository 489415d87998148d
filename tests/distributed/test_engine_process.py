"""``engine_process=True`` (``--engine-process``): one engine in a process of
its own, behind the ``DataParallelEngine`` front with one replica. The same
tokens and logprobs as the in-process engine; stats come from the replica."""

from __future__ import annotations

import os

from octavo import LLM
from octavo.distributed.data_parallel import DataParallelEngine
from octavo.entrypoints.engine_stats import engine_capacity, is_data_parallel, take_snapshot
from tests.distributed.common import (
    assert_same_tokens_and_logprobs,
    engine_options,
    generate,
    greedy,
    make_prompts,
    reference,
    vocab_size,
)


def test_engine_in_its_own_process_gives_the_same_tokens(llama_dir):
    llm = LLM(str(llama_dir), **engine_options(engine_process=True))
    try:
        engine = llm.engine
        assert isinstance(engine, DataParallelEngine) and engine.num_replicas == 1
        assert engine._replicas[0].process.pid != os.getpid()
        assert engine.info.attention_backends == ("torch_paged",)  # reported by the replica, over msgpack
        prompts = make_prompts(vocab_size(llama_dir), seed=5)
        expected = reference(llama_dir, prompts, greedy(logprobs=1))
        assert_same_tokens_and_logprobs(generate(llm, prompts, greedy(logprobs=1)), expected)
        # The server's stats path: the replica's numbers, not this process's.
        assert is_data_parallel(engine)
        capacity = engine_capacity(engine)
        assert (capacity.num_replicas, capacity.num_kv_blocks) == (1, engine.num_kv_blocks)
        snapshot = take_snapshot(engine)
        assert len(snapshot.replicas) == 1 and snapshot.replicas[0].num_requests_finished == len(prompts)
        assert snapshot.stats.num_running == 0 and snapshot.stats.num_free_blocks == engine.num_kv_blocks
    finally:
        llm.engine.shutdown()


def test_a_grammar_that_fails_to_compile_reaches_the_front_as_an_error(llama_dir):
    # An engine process's core hands such a request to the front as an error
    # row and forgets it (it had no output processor of its own to ask).
    from octavo.core.engine_core import EngineCore
    from octavo.core.output_processor import ParentRequest
    from octavo.core.request import Request
    from octavo.engine_args import EngineArgs, build_single_engine

    core = build_single_engine(EngineArgs(model=str(llama_dir), **engine_options()), engine_cls=EngineCore)
    try:
        request = Request("r-0", [5, 6, 7], greedy())
        core.output_processor.add_request("r-0", 0, ParentRequest("r", None, [5, 6, 7], greedy()), greedy())
        core._parent_children["r"] = ["r-0"]

        class FailedCompile:
            awaiting = True

            def take_ready(self):
                return [], [(request, "the grammar did not compile")]

            def wait_for_any(self, timeout):
                pass

            def shutdown(self):
                pass

        core._structured = FailedCompile()
        [row] = core._admit_compiled()
        assert (row.request_id, row.finish_reason, row.new_token_ids) == ("r-0", "error", [])
        assert core.children_of("r") == []
    finally:
        core.shutdown()
