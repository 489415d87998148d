"""The scheduler with pooling requests: whole prompts packed under the token
budget, finished in the step that computes them, no KV cache for encoders,
never waiting forever."""

from __future__ import annotations

import pytest

from octavo.core.engine import POOLING_SAMPLING_PARAMS
from octavo.core.kv_cache_manager import KVCacheManager
from octavo.core.pooling_params import PoolingParams
from octavo.core.request import Request, RequestStatus
from octavo.core.scheduler import Scheduler, SchedulerConfig
from octavo.core.scheduler_output import ModelRunnerOutput
from octavo.core.types import RequestId
from octavo.errors import RequestTooLargeError


def make_scheduler(num_blocks: int = 64, uses_kv_cache: bool = True, **config) -> Scheduler:
    config.setdefault("max_model_len", 128)
    config = SchedulerConfig(uses_kv_cache=uses_kv_cache, **config)
    return Scheduler(config, KVCacheManager(num_blocks if uses_kv_cache else 0, 4, enable_prefix_caching=True))


def add_pooling(scheduler: Scheduler, request_id: str, num_tokens: int) -> Request:
    request = Request(
        request_id=RequestId(request_id),
        prompt_token_ids=list(range(num_tokens)),
        sampling_params=POOLING_SAMPLING_PARAMS,
        max_tokens=0,
        block_size=4,
        pooling_params=PoolingParams(),
    )
    scheduler.add_request(request)
    return request


def run_step(scheduler: Scheduler, pooled: bool = True):
    output = scheduler.schedule()
    vectors = {r: b"\0\0\0\0" for r in output.num_scheduled_tokens} if pooled else {}
    return output, scheduler.update_from_output(output, ModelRunnerOutput(pooled=vectors))


def test_short_inputs_share_a_step_and_long_ones_are_never_split():
    scheduler = make_scheduler(max_num_batched_tokens=16)
    for request_id, num_tokens in [("a", 5), ("b", 5), ("c", 5), ("d", 9), ("e", 2)]:
        add_pooling(scheduler, request_id, num_tokens)
    output, finished = run_step(scheduler)
    # d does not fit whole in what is left (1 token): it waits, and e (FIFO) waits behind it.
    assert output.num_scheduled_tokens == {"a": 5, "b": 5, "c": 5}
    assert [(o.request_id, o.finish_reason, o.pooled) for o in finished] == [(r, "stop", b"\0\0\0\0") for r in "abc"]
    output, _ = run_step(scheduler)
    assert output.num_scheduled_tokens == {"d": 9, "e": 2}
    assert not scheduler.has_unfinished_requests()
    assert scheduler.kv.num_free_blocks == scheduler.kv.num_blocks


def test_pooling_requests_skip_the_prefix_cache():
    scheduler = make_scheduler(max_num_batched_tokens=64)
    add_pooling(scheduler, "a", 12)
    run_step(scheduler)
    add_pooling(scheduler, "b", 12)  # the same tokens
    output, _ = run_step(scheduler)
    assert output.num_scheduled_tokens == {"b": 12}
    assert scheduler.kv.prefix_cache_stats.num_queries == 0


def test_without_a_kv_cache_no_blocks_are_needed():
    scheduler = make_scheduler(uses_kv_cache=False, max_num_batched_tokens=64)
    assert scheduler.kv.num_blocks == 0 and scheduler.kv.usage() == 0.0
    for i in range(6):
        add_pooling(scheduler, f"r{i}", 10)
    output, finished = run_step(scheduler)
    assert len(output.num_scheduled_tokens) == 6 and len(finished) == 6
    assert all(new.block_ids == [] for new in output.new_requests)


def test_an_input_larger_than_one_step_is_refused_at_admission():
    scheduler = make_scheduler(uses_kv_cache=False, max_num_batched_tokens=8)
    with pytest.raises(RequestTooLargeError, match="never split"):
        add_pooling(scheduler, "a", 9)


def test_a_step_without_a_vector_finishes_the_request_as_an_error():
    scheduler = make_scheduler(max_num_batched_tokens=64)
    request = add_pooling(scheduler, "a", 7)
    _, finished = run_step(scheduler, pooled=False)
    assert [(o.request_id, o.finish_reason, o.pooled) for o in finished] == [("a", "error", None)]
    assert request.status == RequestStatus.FINISHED_ERROR
    assert not scheduler.has_unfinished_requests()


def pooling_request(request_id: str, num_tokens: int) -> Request:
    return Request(
        request_id=RequestId(request_id), prompt_token_ids=list(range(num_tokens)), sampling_params=POOLING_SAMPLING_PARAMS,
        max_tokens=0, block_size=4, pooling_params=PoolingParams(),
    )


def test_a_batch_of_pooling_requests_is_admitted_by_its_first_too_large_input():
    scheduler = make_scheduler(uses_kv_cache=False, max_num_batched_tokens=8)
    with pytest.raises(RequestTooLargeError, match="has 9 tokens"):
        scheduler.add_pooling_requests([pooling_request("a", 3), pooling_request("b", 9), pooling_request("c", 12)])
    assert not scheduler.has_unfinished_requests() and not scheduler.requests
    with pytest.raises(ValueError, match="duplicate"):
        scheduler.add_pooling_requests([pooling_request("a", 3), pooling_request("a", 4)])
    assert not scheduler.requests


def test_a_batch_of_pooling_requests_runs_as_the_same_requests_one_by_one():
    scheduler = make_scheduler(max_num_batched_tokens=16)
    requests = [pooling_request(name, n) for name, n in [("a", 5), ("b", 7), ("c", 6)]]
    scheduler.add_pooling_requests(requests)
    output, finished = run_step(scheduler)
    assert output.num_scheduled_tokens == {"a": 5, "b": 7}
    assert [(o.request_id, o.finish_reason) for o in finished] == [("a", "stop"), ("b", "stop")]
    assert scheduler.running == [] and list(scheduler.requests) == ["c"]
    _, finished = run_step(scheduler, pooled=False)
    assert [(o.request_id, o.finish_reason) for o in finished] == [("c", "error")]
    assert not scheduler.has_unfinished_requests() and scheduler.kv.num_free_blocks == 64
