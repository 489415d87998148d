"""Batches in flight (pipeline parallelism) in the scheduler and the engine.

The scheduler must never hand a request to a second batch before the first
one's output is back, never preempt a request whose batch is still running,
and split the schedulable requests so that every stage gets work. The engine
keeps up to ``max_concurrent_batches`` batches in flight and must produce
exactly the tokens of the one-batch-at-a-time loop.
"""

from __future__ import annotations

from octavo.core.kv_cache_manager import KVCacheManager
from octavo.core.request import Request, RequestStatus
from octavo.core.sampling_params import SamplingParams
from octavo.core.scheduler import Scheduler, SchedulerConfig
from octavo.core.scheduler_output import ModelRunnerOutput
from octavo.core.types import RequestId
from tests.distributed.common import engine_options, generate, make_prompts, token_ids, vocab_size

BLOCK = 16


def make_scheduler(num_blocks: int = 64, batches: int = 2) -> Scheduler:
    config = SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=16, max_model_len=256, max_concurrent_batches=batches)
    return Scheduler(config, KVCacheManager(num_blocks, BLOCK, enable_prefix_caching=False))


def make_request(request_id: str, num_prompt_tokens: int = 5, max_tokens: int = 8) -> Request:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    prompt = [3 + i % 50 for i in range(num_prompt_tokens)]
    return Request(RequestId(request_id), prompt, params, max_tokens=max_tokens, block_size=BLOCK)


def sampled(scheduler_output, token_id: int = 7) -> ModelRunnerOutput:
    return ModelRunnerOutput(sampled_token_ids={r: [token_id] for r in scheduler_output.num_scheduled_tokens})


def test_each_request_is_in_one_batch_at_a_time():
    scheduler = make_scheduler()
    for i in range(4):
        scheduler.add_request(make_request(f"r{i}"))
    first, second = scheduler.schedule(), scheduler.schedule()
    # Each batch takes its share, and the two are disjoint.
    assert list(first.num_scheduled_tokens) == ["r0", "r1"]
    assert list(second.num_scheduled_tokens) == ["r2", "r3"]
    assert scheduler.schedule().is_empty  # everyone is in flight
    scheduler.update_from_output(first, sampled(first))
    third = scheduler.schedule()
    assert third.num_scheduled_tokens == {"r0": 1, "r1": 1}
    assert set(third.cached_requests.request_ids) == {"r0", "r1"}


def test_preemption_spares_a_request_in_flight():
    # 4 blocks: two 32-token prompts fill them; the first to need a fifth
    # block must not take the blocks of the other while its batch runs.
    scheduler = make_scheduler(num_blocks=4)
    scheduler.add_request(make_request("a", 32))
    scheduler.add_request(make_request("b", 32))
    batch_a, batch_b = scheduler.schedule(), scheduler.schedule()
    assert list(batch_a.num_scheduled_tokens) == ["a"] and list(batch_b.num_scheduled_tokens) == ["b"]
    scheduler.update_from_output(batch_a, sampled(batch_a))
    blocks_of_b = scheduler.kv.block_ids(RequestId("b"))
    assert scheduler.schedule().is_empty  # a needs a block; only b (in flight) holds any
    request_b = scheduler.requests[RequestId("b")]
    assert request_b.status == RequestStatus.RUNNING
    assert scheduler.kv.block_ids(RequestId("b")) == blocks_of_b
    assert scheduler.requests[RequestId("a")].status == RequestStatus.PREEMPTED


def test_aborted_request_in_flight_and_its_reused_id():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("r"))
    old_batch = scheduler.schedule()
    scheduler.finish_requests(["r"], RequestStatus.FINISHED_ABORTED)
    new_request = make_request("r", 9)
    scheduler.add_request(new_request)
    new_batch = scheduler.schedule()  # the new "r" is not the one in flight
    assert new_batch.num_scheduled_tokens == {"r": 9}
    assert new_batch.finished_request_ids == {"r"}
    assert scheduler.update_from_output(old_batch, sampled(old_batch, 11)) == []
    assert new_request.num_computed_tokens == 0 and new_request.output_token_ids == []
    outputs = scheduler.update_from_output(new_batch, sampled(new_batch, 12))
    assert [o.new_token_ids for o in outputs] == [[12]]
    assert new_request.num_computed_tokens == 9


def test_dropped_request_ids_survive_an_empty_schedule():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a"))
    scheduler.add_request(make_request("b"))
    batch_a = scheduler.schedule()
    scheduler.schedule()  # b in flight too
    scheduler.update_from_output(batch_a, sampled(batch_a))
    scheduler.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
    assert scheduler.schedule().is_empty
    scheduler.add_request(make_request("c"))
    batch_c = scheduler.schedule()
    assert batch_c.finished_request_ids == {"a"}


class DeferredExecutor:
    """Runs a batch only when its result is asked for: two batches in flight
    in one process, with the same ordering contract as a pipeline."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.max_concurrent_batches = 2
        self.num_pending = 0
        self.max_pending = 0

    def execute_model(self, scheduler_output, non_block=False):
        executor = self

        class Pending:
            def result(self):
                executor.num_pending -= 1
                return executor.inner.execute_model(scheduler_output)

        self.num_pending += 1
        self.max_pending = max(self.max_pending, self.num_pending)
        pending = Pending()
        return pending if non_block else pending.result()

    def shutdown(self):
        self.inner.shutdown()


def test_pipelined_engine_gives_the_same_tokens(llama_dir, make_llm):
    prompts = make_prompts(vocab_size(llama_dir)) * 2
    # A small budget and a small cache: chunked prefill and preemption happen.
    options = engine_options(max_num_batched_tokens=24, num_kv_blocks=12, enable_prefix_caching=False)
    from tests.distributed.common import greedy

    expected = generate(make_llm(llama_dir, **options), prompts, greedy(logprobs=1))
    llm = make_llm(llama_dir, **options)
    engine = llm.engine
    engine.executor = DeferredExecutor(engine.executor)
    engine.max_concurrent_batches = engine.scheduler.config.max_concurrent_batches = 2
    outputs = generate(llm, prompts, greedy(logprobs=1))
    assert token_ids(outputs) == token_ids(expected)
    assert engine.executor.max_pending == 2
    assert engine.get_stats().num_preemptions > 0
