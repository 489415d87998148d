"""The engine as an engine process runs it: it schedules, runs the model and
reports each step's per-request progress (``EngineCoreOutput``: new token
ids, logprobs, finish reason), but detokenizes nothing and builds no
``RequestOutput``.

Its front (``DataParallelEngine``, in the API process) runs the
``OutputProcessor`` on those reports, as vLLM's API server does: turning
tokens into text and outputs is per-token Python that would otherwise run
between the accelerator's steps. With many streams most steps also prefill
a new prompt, and such steps do not overlap host work with the device, so
every millisecond of host work per step is a millisecond of lost
throughput.

Stop strings need text, so the front finds them and finishes those
children here (``finish_children``); a child may run a step past its stop
string meanwhile, and the front drops what it sends after it.
"""

from __future__ import annotations

import time

from octavo.core.engine import LLMEngine
from octavo.core.request import RequestStatus
from octavo.core.scheduler_output import EngineCoreOutput, ModelRunnerOutput, SchedulerOutput


class ChildTracker:
    """Stands in for the ``OutputProcessor``: remembers each child's parent,
    and when each was first scheduled until its first output carries it."""

    def __init__(self) -> None:
        self.parent_of: dict[str, str] = {}
        self.scheduled_at: dict[str, float] = {}
        self._seen: set[str] = set()

    def add_request(self, request_id: str, index: int, parent, params) -> None:
        self.parent_of[request_id] = parent.request_id

    def add_pooling_request(self, request_id: str, prompt, prompt_token_ids) -> None:
        self.parent_of[request_id] = request_id  # its own parent: one output, the pooled vector

    def add_pooling_requests(self, request_ids: list[str], prompts, prompt_token_ids) -> None:
        self.parent_of.update((request_id, request_id) for request_id in request_ids)

    def abort(self, request_ids: list[str]) -> list[str]:
        for request_id in request_ids:
            self.scheduled_at.pop(request_id, None)
            self._seen.discard(request_id)
        return [p for r in request_ids if (p := self.parent_of.pop(r, None)) is not None]

    def mark_scheduled(self, scheduler_output: SchedulerOutput) -> None:
        now = time.monotonic()
        for new in scheduler_output.new_requests:
            if new.request_id not in self._seen and new.request_id in self.parent_of:
                self._seen.add(new.request_id)  # a preempted request is new again: keep the first time
                self.scheduled_at[new.request_id] = now

    def stamp(self, output: EngineCoreOutput) -> None:
        output.first_scheduled_time = self.scheduled_at.pop(output.request_id, None)

    def forget(self, request_id: str) -> str | None:
        self.scheduled_at.pop(request_id, None)
        self._seen.discard(request_id)
        return self.parent_of.pop(request_id, None)


class EngineCore(LLMEngine):
    """An ``LLMEngine`` whose ``step()`` returns ``EngineCoreOutput``s (one per child request)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.output_processor = ChildTracker()  # type: ignore[assignment]

    def children_of(self, request_id: str) -> list[str]:
        """The unfinished children of a request (itself when ``n == 1``)."""
        return list(self._parent_children.get(request_id, ()))

    def finish_children(self, child_ids: list[str], status: RequestStatus = RequestStatus.FINISHED_STOPPED) -> None:
        """End children from outside: a stop string the front found, or a front that left."""
        self.scheduler.finish_requests(child_ids, status)
        for child_id in child_ids:
            self._forget_child(child_id)

    def _process(self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        if self.step_observer is not None:
            self.step_observer(scheduler_output)
        core_outputs = self.scheduler.update_from_output(scheduler_output, runner_output)
        for output in core_outputs:
            self.output_processor.stamp(output)
            if output.finish_reason is not None:
                self._forget_child(output.request_id)
        return core_outputs

    def _failed_outputs(self, errors: list[EngineCoreOutput]) -> list[EngineCoreOutput]:
        """Requests that ended before they were scheduled go to the front as they are."""
        for output in errors:
            self._forget_child(output.request_id)
        return errors

    def _forget_child(self, child_id: str) -> None:
        parent_id = self.output_processor.forget(child_id)
        children = self._parent_children.get(parent_id)
        if children is not None and child_id in children:
            children.remove(child_id)
            if not children:
                del self._parent_children[parent_id]
