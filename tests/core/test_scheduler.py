"""The scheduler on its own: budgets, chunking, preemption, admission."""

from __future__ import annotations

import pytest

from octavo.core.kv_cache_manager import KVCacheManager
from octavo.core.request import Request, RequestStatus
from octavo.core.sampling_params import SamplingParams
from octavo.core.scheduler import Scheduler, SchedulerConfig
from octavo.core.scheduler_output import ModelRunnerOutput
from octavo.core.types import RequestId
from octavo.errors import RequestTooLargeError


def make_scheduler(num_blocks=64, block_size=4, **config) -> Scheduler:
    config.setdefault("max_model_len", 128)
    return Scheduler(SchedulerConfig(**config), KVCacheManager(num_blocks, block_size, enable_prefix_caching=False))


def add(scheduler: Scheduler, request_id: str, num_prompt: int, max_tokens: int = 4, priority: int = 0) -> Request:
    request = Request(
        request_id=RequestId(request_id),
        prompt_token_ids=list(range(num_prompt)),
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        max_tokens=max_tokens,
        block_size=scheduler.kv.block_size,
        priority=priority,
    )
    scheduler.add_request(request)
    return request


def step(scheduler: Scheduler, token_id: int = 7):
    """Schedule, pretend to run (sampling ``token_id`` where due), update."""
    output = scheduler.schedule()
    sampled = {}
    for request_id, num_tokens in output.num_scheduled_tokens.items():
        request = scheduler.requests[RequestId(request_id)]
        if request.num_computed_tokens + num_tokens == request.num_tokens:
            sampled[request_id] = [token_id]
    scheduler.update_from_output(output, ModelRunnerOutput(sampled_token_ids=sampled))
    return output


def test_prompts_share_the_token_budget_in_fifo_order():
    scheduler = make_scheduler(max_num_batched_tokens=10)
    add(scheduler, "a", 6)
    add(scheduler, "b", 6)
    output = step(scheduler)
    assert output.num_scheduled_tokens == {"a": 6, "b": 4}  # b's prompt is chunked
    output = step(scheduler)
    # a decodes one token, b finishes its prompt.
    assert output.num_scheduled_tokens == {"a": 1, "b": 2}
    assert output.cached_requests.request_ids == ["a", "b"]
    assert output.cached_requests.new_token_ids[0] == [7]


def test_without_chunked_prefill_a_prompt_waits_for_room():
    scheduler = make_scheduler(max_num_batched_tokens=10, enable_chunked_prefill=False)
    add(scheduler, "a", 6)
    add(scheduler, "b", 6)
    assert step(scheduler).num_scheduled_tokens == {"a": 6}


def test_sequence_cap():
    scheduler = make_scheduler(max_num_batched_tokens=100, max_num_seqs=2)
    for name in "abc":
        add(scheduler, name, 3)
    assert list(step(scheduler).num_scheduled_tokens) == ["a", "b"]


def test_preemption_takes_the_newest_and_recomputes_it():
    # 6 blocks of 4 tokens: a and b need 2 blocks each for prompts of 8, then grow.
    scheduler = make_scheduler(num_blocks=5, max_num_batched_tokens=64)
    a = add(scheduler, "a", 8, max_tokens=8)
    b = add(scheduler, "b", 8, max_tokens=8)
    step(scheduler)  # both prefilled, 4 blocks used, one token each
    output = step(scheduler)  # both need a 3rd block: only one is free -> b preempted
    assert output.num_scheduled_tokens == {"a": 1}
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert scheduler.num_preemptions == 1
    # Run until done: b resumes with its prompt and its generated token recomputed.
    resumed = []
    while scheduler.has_unfinished_requests():
        output = step(scheduler)
        resumed += [n for n in output.new_requests if n.request_id == "b"]
    assert len(resumed) == 1 and resumed[0].output_token_ids == [7] and resumed[0].num_computed_tokens == 0
    assert output.num_scheduled_tokens.get("b", 0) >= 1
    assert a.num_output_tokens == 8 and b.num_output_tokens == 8
    assert scheduler.kv.num_free_blocks == 5


def test_preempted_request_is_dropped_from_the_runner():
    scheduler = make_scheduler(num_blocks=5, max_num_batched_tokens=64)
    add(scheduler, "a", 8, max_tokens=8)
    add(scheduler, "b", 8, max_tokens=8)
    step(scheduler)
    output = step(scheduler)  # preempts b in this very step
    assert output.finished_request_ids == {"b"}


def test_request_that_can_never_fit_is_refused():
    scheduler = make_scheduler(num_blocks=4, block_size=4)
    with pytest.raises(RequestTooLargeError, match="KV cache holds only 4 blocks"):
        add(scheduler, "a", 10, max_tokens=10)
    assert not scheduler.has_unfinished_requests()


def test_length_cap_and_free():
    scheduler = make_scheduler(max_num_batched_tokens=64)
    request = add(scheduler, "a", 5, max_tokens=3)
    for _ in range(3):
        step(scheduler)
    assert request.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert scheduler.kv.num_free_blocks == scheduler.kv.num_blocks
    assert not scheduler.has_unfinished_requests()


def test_abort_frees_blocks():
    scheduler = make_scheduler(max_num_batched_tokens=64)
    add(scheduler, "a", 9)
    add(scheduler, "b", 9)
    step(scheduler)
    scheduler.finish_requests(["a", "b"], RequestStatus.FINISHED_ABORTED)
    assert scheduler.kv.num_free_blocks == scheduler.kv.num_blocks
    # The runner hears of the drops with the next batch it is sent.
    assert scheduler.schedule().is_empty
    add(scheduler, "c", 3)
    assert scheduler.schedule().finished_request_ids == {"a", "b"}


def test_async_scheduling_counts_samples_in_flight_as_placeholders():
    """Step N+1 is scheduled before step N's output: the token N samples is a
    placeholder, computed by N+1; the last token is never scheduled past."""
    scheduler = make_scheduler(max_num_batched_tokens=10, async_scheduling=True)
    request = add(scheduler, "a", 6, max_tokens=3)
    first = scheduler.schedule()  # the prompt; samples output 0
    assert first.num_scheduled_tokens == {"a": 6}
    assert (request.num_computed_tokens, request.num_output_placeholders) == (6, 1)
    second = scheduler.schedule()  # computes output 0 (still unknown), samples output 1
    assert second.num_scheduled_tokens == {"a": 1} and second.cached_requests.new_token_ids[0] == []
    assert (request.num_computed_tokens, request.num_output_placeholders) == (7, 2)
    scheduler.update_from_output(first, ModelRunnerOutput(sampled_token_ids={"a": [11]}))
    assert (request.output_token_ids, request.num_output_placeholders) == ([11], 1)
    third = scheduler.schedule()  # samples output 2, the last
    assert third.num_scheduled_tokens == {"a": 1} and request.num_output_placeholders == 2
    # Every remaining token is in flight: nothing more to schedule.
    assert scheduler.schedule().is_empty
    scheduler.update_from_output(second, ModelRunnerOutput(sampled_token_ids={"a": [12]}))
    assert scheduler.schedule().is_empty
    outputs = scheduler.update_from_output(third, ModelRunnerOutput(sampled_token_ids={"a": [13]}))
    assert outputs[0].finish_reason == "length" and request.output_token_ids == [11, 12, 13]
    assert not scheduler.has_unfinished_requests() and scheduler.kv.num_free_blocks == scheduler.kv.num_blocks


def test_async_scheduling_drops_samples_of_preempted_requests():
    scheduler = make_scheduler(num_blocks=4, max_num_batched_tokens=16, async_scheduling=True)
    a, b = add(scheduler, "a", 8, max_tokens=8), add(scheduler, "b", 8, max_tokens=8)
    first = scheduler.schedule()  # both prompts: 2 blocks each, every block taken
    second = scheduler.schedule()  # a needs a third block: b (newest, in flight) is preempted
    assert second.num_scheduled_tokens == {"a": 1} and b.status == RequestStatus.PREEMPTED
    assert (b.num_computed_tokens, b.num_output_placeholders) == (0, 0)
    scheduler.update_from_output(first, ModelRunnerOutput(sampled_token_ids={"a": [5], "b": [6]}))
    assert a.output_token_ids == [5] and b.output_token_ids == []  # b's sample is dropped
