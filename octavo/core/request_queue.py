"""The scheduler's waiting queue, in the order of its scheduling policy.

``fcfs``: first come, first served; a preempted request goes back to the
head. ``priority``: the lowest ``priority`` value first, then the earliest
arrival (vLLM's order); a preempted request goes back to the place its key
gives it, which is ahead of every later arrival of the same priority.

Both queues answer the same small interface (``add``, ``requeue``, ``peek``,
``pop``, ``remove``, ``len``, iteration), so the scheduler has one code path.
``running_victim`` says which running request a policy preempts first.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterator

from octavo.core.request import Request
from octavo.errors import InvalidArgumentError

SCHEDULING_POLICIES = ("fcfs", "priority")


def check_policy(policy: str) -> None:
    if policy not in SCHEDULING_POLICIES:
        raise InvalidArgumentError(
            f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}, got {policy!r}",
            param="scheduling_policy",
        )


def priority_key(request: Request) -> tuple[int, float]:
    """Smaller is served first (and preempted last)."""
    return request.priority, request.arrival_time


class FCFSQueue:
    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def add(self, request: Request) -> None:
        self._queue.append(request)

    def requeue(self, request: Request) -> None:
        """A preempted request: first in line again."""
        self._queue.appendleft(request)

    def peek(self) -> Request:
        return self._queue[0]

    def pop(self) -> Request:
        return self._queue.popleft()

    def remove(self, request: Request) -> None:
        self._queue.remove(request)

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)


class PriorityQueue:
    """A heap of ``(priority, arrival_time, tie-breaker, request)``."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []
        self._tie = itertools.count()

    def add(self, request: Request) -> None:
        heapq.heappush(self._heap, (*priority_key(request), next(self._tie), request))

    def requeue(self, request: Request) -> None:
        self.add(request)

    def peek(self) -> Request:
        return self._heap[0][3]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[3]

    def remove(self, request: Request) -> None:
        # Aborts are rare next to pops: an O(n) rebuild keeps the heap simple.
        self._heap = [entry for entry in self._heap if entry[3] is not request]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (entry[3] for entry in sorted(self._heap))


def make_waiting_queue(policy: str) -> FCFSQueue | PriorityQueue:
    check_policy(policy)
    return PriorityQueue() if policy == "priority" else FCFSQueue()


def running_victim(candidates: list[Request], policy: str) -> Request:
    """The request to preempt among ``candidates`` (running, oldest first):
    the newest under fcfs, the lowest priority (then newest) under priority."""
    if policy == "priority":
        return max(candidates, key=priority_key)
    return candidates[-1]
