"""An idle engine's pooling call stepped straight through the executor (issue 21).

``LLM.embed`` of a batch of short sentences through the scheduler pays, per
input, for what a request that may wait, be preempted or stream needs: a
``Request``, its place in the waiting queue, the runner view's record, a
state for its output, the pass that retires it. On a GPU host that was about
a third of the host's work for 256 MiniLM sentences, as much as the model's
kernels. An encoder's inputs need none of it while the engine has nothing
else to do: no KV cache, each input computed whole in one step, none
outliving its step.

So while the engine is idle (``LLMEngine.pools_directly``) an encoder's
pooling call goes through here instead: the inputs are checked as
``add_pooling_requests`` checks them (the same errors, in the same order),
cut into the steps the scheduler would form from the same queue (first come
first served; at most ``max_num_seqs`` inputs and ``max_num_batched_tokens``
tokens a step, an input never split), each step handed to the executor with
as many in flight as the engine keeps, and each input's output made from
its pooled row. The same steps give the same vectors, bit for bit. Batches
arriving one after another (a corpus tokenized a chunk at a time) fill the
steps as one queue would: a step is launched once it is full or the inputs
have ended, so chunk boundaries never change the steps.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from octavo.core.outputs import PoolingOutput, PoolingRequestOutput, RequestMetrics
from octavo.core.pooling_batch import POOLING_SAMPLING_PARAMS, PoolingBatch, check_pooling_batch
from octavo.core.pooling_params import PoolingParams
from octavo.core.scheduler_config import check_pooling_lengths
from octavo.core.scheduler_output import ModelRunnerOutput, NewRequestData, SchedulerOutput
from octavo.env_switches import switch_from_env
from octavo.errors import EngineDeadError

if TYPE_CHECKING:
    from octavo.core.engine import LLMEngine

POOLING_LANE_ENV = "OCTAVO_POOLING_LANE"


def lane_setting() -> bool:
    """``OCTAVO_POOLING_LANE=0`` sends every pooling call through the scheduler (A/B runs, tests)."""
    return switch_from_env(POOLING_LANE_ENV, default=True)


@dataclass
class QueuedInputs:
    """Checked inputs not yet in a step, as columns, oldest first."""

    request_ids: list[str] = field(default_factory=list)
    texts: list[str | None] = field(default_factory=list)
    token_ids: list[list[int]] = field(default_factory=list)
    token_type_ids: list[list[int] | None] = field(default_factory=list)
    arrival_times: list[float] = field(default_factory=list)

    def extend(self, batch: PoolingBatch, arrival_time: float) -> None:
        self.request_ids += batch.request_ids
        self.texts += batch.texts
        self.token_ids += batch.token_ids
        self.token_type_ids += batch.token_type_ids
        self.arrival_times += [arrival_time] * len(batch.request_ids)

    def step_size(self, max_tokens: int, max_inputs: int, full_only: bool) -> int:
        """How many of the oldest inputs the next step takes, as the scheduler
        takes waiting inputs: in order, while they fit. With ``full_only``, 0
        unless the step is full (it could not grow by waiting for more inputs)."""
        tokens, count = 0, 0
        for ids in self.token_ids:
            if tokens + len(ids) > max_tokens:
                return count
            tokens += len(ids)
            count += 1
            if count == max_inputs:
                return count
        return 0 if full_only else count

    def take(self, count: int) -> QueuedInputs:
        """The oldest ``count`` inputs, removed from the queue."""
        taken = QueuedInputs(*(column[:count] for column in self._columns()))
        for column in self._columns():
            del column[:count]
        return taken

    def _columns(self) -> tuple[list, ...]:
        return self.request_ids, self.texts, self.token_ids, self.token_type_ids, self.arrival_times


@dataclass
class LaneStep:
    """A step handed to the executor: its inputs, when, and what to collect."""

    inputs: QueuedInputs
    scheduler_output: SchedulerOutput
    launched_at: float
    pending: Any  # a PendingOutput (``result()``), or the ModelRunnerOutput itself


class PoolingLane:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine

    def run(
        self, batches: Iterable[PoolingBatch], params: PoolingParams,
        on_outputs: Callable[[int], None] | None = None,
    ) -> list[PoolingRequestOutput]:
        """Every batch's outputs, in order; ``on_outputs(n)`` after each step
        (progress bars). A bad input raises, as ``add_pooling_requests`` would,
        when its batch is reached; the steps in flight are collected first."""
        config = self.engine.scheduler.config
        max_tokens, max_inputs = config.max_num_batched_tokens, config.max_num_seqs
        queued, in_flight, outputs = QueuedInputs(), deque(), []
        try:
            for batch in batches:
                self._check(batch, params)
                queued.extend(batch, time.monotonic())
                while count := queued.step_size(max_tokens, max_inputs, full_only=True):
                    self._launch(queued.take(count), params, in_flight, outputs, on_outputs)
            while count := queued.step_size(max_tokens, max_inputs, full_only=False):
                self._launch(queued.take(count), params, in_flight, outputs, on_outputs)
            while in_flight:
                outputs += self._finish(in_flight.popleft(), on_outputs)
        except BaseException:
            self._drain(in_flight)
            raise
        return outputs

    def _check(self, batch: PoolingBatch, params: PoolingParams) -> None:
        """``add_pooling_requests``' checks: the inputs, then whether a step can hold each."""
        engine = self.engine
        check_pooling_batch(engine, batch, params, engine._parent_children)
        check_pooling_lengths(batch.token_ids, engine.scheduler.config)

    def _launch(self, inputs: QueuedInputs, params: PoolingParams, in_flight: deque, outputs: list,
                on_outputs: Callable[[int], None] | None) -> None:
        """Hand a step to the executor, then collect the oldest while the engine's limit is reached."""
        new_requests = [
            NewRequestData(request_id, token_ids, [], POOLING_SAMPLING_PARAMS, [], 0, params, types)
            for request_id, token_ids, types in zip(inputs.request_ids, inputs.token_ids, inputs.token_type_ids)
        ]
        scheduler_output = SchedulerOutput(
            new_requests=new_requests, num_scheduled_tokens=dict(zip(inputs.request_ids, map(len, inputs.token_ids)))
        )
        engine = self.engine
        non_block = engine.max_concurrent_batches > 1
        try:
            pending = engine.executor.execute_model(scheduler_output, non_block=non_block)
        except EngineDeadError as exc:
            engine._fail(exc)
        in_flight.append(LaneStep(inputs, scheduler_output, time.monotonic(), pending))
        while len(in_flight) >= engine.max_concurrent_batches:
            outputs += self._finish(in_flight.popleft(), on_outputs)

    def _finish(self, step: LaneStep, on_outputs: Callable[[int], None] | None) -> list[PoolingRequestOutput]:
        """A step's outputs, one per input, from its pooled rows (an input without
        one fails, as the scheduler's path fails it)."""
        engine = self.engine
        try:
            runner_output = step.pending if isinstance(step.pending, ModelRunnerOutput) else step.pending.result()
        except EngineDeadError as exc:
            engine._fail(exc)
        if runner_output.compilations is not None:
            engine.compilations = runner_output.compilations
        if engine.step_observer is not None:
            engine.step_observer(step.scheduler_output)
        pooled, now, inputs = runner_output.pooled, time.monotonic(), step.inputs
        # Inputs that arrived together share one metrics object: their timings are the same.
        metrics_by_arrival = {arrival: RequestMetrics(arrival, step.launched_at, None, None, now)
                              for arrival in set(inputs.arrival_times)}
        outputs = []
        for request_id, text, token_ids, arrival in zip(inputs.request_ids, inputs.texts, inputs.token_ids,
                                                        inputs.arrival_times):
            vector = pooled.get(request_id)
            metrics = metrics_by_arrival[arrival]
            if vector is None:
                outputs.append(PoolingRequestOutput(request_id, text, token_ids, None, True, "error", metrics))
            else:
                outputs.append(PoolingRequestOutput(request_id, text, token_ids, PoolingOutput(vector), True, "stop", metrics))
        if on_outputs is not None:
            on_outputs(len(outputs))
        return outputs

    @staticmethod
    def _drain(in_flight: deque) -> None:
        """Collect the steps still in flight after an error (their outputs belong
        to no one, but an overlapped step's pinned rows must not outlive the call)."""
        while in_flight:
            step = in_flight.popleft()
            if not isinstance(step.pending, ModelRunnerOutput):
                try:
                    step.pending.result()
                except Exception:  # the error already raising is the one to report
                    pass
