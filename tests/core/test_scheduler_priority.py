"""The priority scheduling policy: queue order, preemption of lower-priority
running requests for a waiting one, victims under block pressure."""

from __future__ import annotations

import pytest

from octavo.core.engine import check_priority
from octavo.core.request import Request, RequestStatus
from octavo.core.request_queue import FCFSQueue, PriorityQueue
from octavo.core.scheduler import Scheduler
from octavo.errors import InvalidArgumentError
from tests.core.test_scheduler import add as base_add
from tests.core.test_scheduler import make_scheduler as base_make_scheduler
from tests.core.test_scheduler import step


def make_scheduler(num_blocks=64, block_size=4, **config) -> Scheduler:
    config.setdefault("policy", "priority")
    return base_make_scheduler(num_blocks, block_size, **config)


def add(scheduler: Scheduler, request_id: str, priority: int, num_prompt: int = 4, max_tokens: int = 2) -> Request:
    return base_add(scheduler, request_id, num_prompt, max_tokens, priority=priority)


def run_to_completion(scheduler: Scheduler) -> list[str]:
    """Step until idle; the ids in the order they finished."""
    finished: list[str] = []
    for _ in range(200):
        if not scheduler.has_unfinished_requests():
            return finished
        before = set(scheduler.requests)
        step(scheduler)
        finished += sorted(before - set(scheduler.requests))
    raise AssertionError("the scheduler did not finish")


def test_lower_value_first_then_arrival():
    scheduler = make_scheduler(max_num_seqs=1)
    for request_id, priority in (("a", 5), ("b", 1), ("c", 1), ("d", 0)):
        add(scheduler, request_id, priority)
    assert [r.request_id for r in scheduler.waiting] == ["d", "b", "c", "a"]
    assert run_to_completion(scheduler) == ["d", "b", "c", "a"]
    assert scheduler.num_preemptions == 0


def test_waiting_high_priority_preempts_a_lower_running_one():
    scheduler = make_scheduler(max_num_seqs=1)
    low = add(scheduler, "low", 5, max_tokens=4)
    step(scheduler)
    assert low.status == RequestStatus.RUNNING and low.num_output_tokens == 1
    add(scheduler, "high", 0)
    output = step(scheduler)
    assert list(output.num_scheduled_tokens) == ["high"]
    assert low.status == RequestStatus.PREEMPTED and low.num_computed_tokens == 0
    assert "low" in output.finished_request_ids or "low" in scheduler.runner_view.dropped
    assert scheduler.num_preemptions == 1
    assert run_to_completion(scheduler) == ["high", "low"]
    assert low.num_output_tokens == 4  # recomputed, then finished


def test_equal_priority_never_preempts():
    scheduler = make_scheduler(max_num_seqs=1)
    add(scheduler, "first", 3, max_tokens=3)
    step(scheduler)
    add(scheduler, "second", 3)
    assert run_to_completion(scheduler) == ["first", "second"]
    assert scheduler.num_preemptions == 0


def test_high_priority_preempts_for_blocks():
    # 6 blocks of 4 tokens: the low request holds 4 (16 prompt tokens), the high one needs 3.
    scheduler = make_scheduler(num_blocks=6, max_num_seqs=4)
    low = add(scheduler, "low", 9, num_prompt=16, max_tokens=2)
    step(scheduler)
    add(scheduler, "high", 1, num_prompt=10)
    output = step(scheduler)
    assert "high" in output.num_scheduled_tokens and "low" not in output.num_scheduled_tokens
    assert low.status == RequestStatus.PREEMPTED
    assert run_to_completion(scheduler) == ["high", "low"]


def test_block_pressure_preempts_the_lowest_priority_not_the_newest():
    # Three running requests grow until blocks run out: the victim is the lowest priority.
    scheduler = make_scheduler(num_blocks=7, max_num_seqs=3)
    add(scheduler, "mid", 2, num_prompt=7, max_tokens=12)
    add(scheduler, "lowest", 8, num_prompt=7, max_tokens=12)
    add(scheduler, "high", 0, num_prompt=7, max_tokens=12)
    victims = []
    for _ in range(40):
        if not scheduler.has_unfinished_requests():
            break
        before = scheduler.num_preemptions
        step(scheduler)
        if scheduler.num_preemptions > before:
            victims += [r.request_id for r in scheduler.waiting]
    assert victims and victims[0] == "lowest"


def test_fcfs_keeps_the_newest_victim_and_arrival_order():
    scheduler = make_scheduler(max_num_seqs=1, policy="fcfs")
    assert isinstance(scheduler.waiting, FCFSQueue)
    for request_id in ("a", "b", "c"):
        add(scheduler, request_id, 0)
    assert run_to_completion(scheduler) == ["a", "b", "c"]


def test_priority_queue_remove_and_requeue():
    queue = PriorityQueue()
    scheduler = make_scheduler()
    requests = [add(scheduler, name, prio) for name, prio in (("x", 3), ("y", 1), ("z", 2))]
    for request in requests:
        queue.add(request)
    queue.remove(requests[1])
    assert [r.request_id for r in queue] == ["z", "x"]
    queue.requeue(requests[1])
    assert queue.pop().request_id == "y" and len(queue) == 2


def test_abort_of_a_waiting_request_under_priority():
    scheduler = make_scheduler(max_num_seqs=1)
    add(scheduler, "a", 1)
    add(scheduler, "b", 2)
    scheduler.finish_requests(["b"], RequestStatus.FINISHED_ABORTED)
    assert [r.request_id for r in scheduler.waiting] == ["a"]


def test_priority_needs_the_priority_policy():
    check_priority(0, "fcfs")
    check_priority(-3, "priority")
    with pytest.raises(InvalidArgumentError, match="scheduling-policy priority"):
        check_priority(1, "fcfs")
    with pytest.raises(InvalidArgumentError, match="integer"):
        check_priority(1.5, "priority")  # type: ignore[arg-type]
