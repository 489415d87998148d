"""Async scheduling, the runner's side: step N+1 is launched before step N's
samples reach the host, for every kind of step and every sampling parameter.

The engine schedules step N+1 while step N runs (``core/scheduler.py``
counts N's samples as *placeholders*: tokens whose ids are not known yet).
Here, for step N+1:

1. its inputs are prepared on the host; where an input token is a
   placeholder (the token step N samples), it is copied on the device from
   N's sampled tokens, in stream order, after N's sampling;
2. its model forward is launched;
3. step N is *collected*: the host waits for N's samples (the device has
   N+1's forward queued, so it stays busy), writes them into the runner's
   token ids in place of the placeholders, and N's output is ready;
4. N+1's sampling is launched with the complete token history (penalties,
   min_tokens, the seeded draw of each output index all see N's token),
   its results are copied to pinned host memory behind an event, and each
   request that samples gets a placeholder at the end of its token ids.

The sampler is the synchronous path's own (``Sampler.sample``, no host
syncs) and the model step is the runner's (``ModelRunner.forward``): tokens
are those of the synchronous path. Prompt logprobs are computed in the step
(they read the device once, so such a step does not overlap).

A request finished, aborted or preempted while its step was in flight is
dropped from the runner's state before the step is collected; its sample is
then simply not written (the state object it belonged to is gone).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from octavo.core.scheduler_output import ModelRunnerOutput, SchedulerOutput
from octavo.runtime.host_copy import copy_to_host
from octavo.runtime.input_batch import PreparedBatch
from octavo.runtime.request_state import RunnerRequestState
from octavo.runtime.sampled_batch import SampledBatch

# Written where a token is not known yet; always overwritten before it is read.
PLACEHOLDER_TOKEN_ID = 0


@dataclass
class LaunchedSamples:
    """A step whose sampling is on its way to the host."""

    request_ids: list[str]
    # The runner state each sample belongs to and the index of its
    # placeholder in that state's token ids.
    placeholders: list[tuple[RunnerRequestState, int]]
    sampled: SampledBatch | None
    host: list[torch.Tensor]
    done: object | None  # a device event; None where the copies were synchronous
    output: ModelRunnerOutput = field(default_factory=ModelRunnerOutput)
    collected: bool = False

    def rows_by_request(self) -> dict[str, int]:
        """Each request's row (a request samples at most once a step): one
        lookup per request, where a scan of the rows for each was quadratic."""
        return {request_id: row for row, request_id in enumerate(self.request_ids)}


class AsyncStepper:
    """Runs a ``ModelRunner``'s steps with the sampling of the step before still in flight."""

    def __init__(self, runner) -> None:
        self.runner = runner
        self.previous: LaunchedSamples | None = None
        # Input tokens taken from a step still in flight (tests read it).
        self.num_device_inputs = 0

    def execute(self, scheduler_output: SchedulerOutput) -> LaunchedSamples:
        runner = self.runner
        runner.apply_scheduler_output(scheduler_output)
        previous = self.previous
        if scheduler_output.is_empty:
            self.collect(previous)
            return _finished(ModelRunnerOutput())
        batch, logits, hidden = runner.forward(
            scheduler_output, before_model=lambda b: self._fill_placeholders(scheduler_output, b, previous)
        )
        self.collect(previous)
        step = self._launch_sampling(batch, logits, scheduler_output)
        if batch.prompt_logprob_spans:
            runner.prompt_logprobs(hidden, batch, step.output)
        self.previous = step
        return step

    def collect(self, step: LaunchedSamples | None) -> ModelRunnerOutput:
        """Wait for ``step``'s samples and write them where their placeholders are."""
        if step is None or step.collected:
            return step.output if step is not None else ModelRunnerOutput()
        step.collected = True
        if step.sampled is None:
            return step.output
        if step.done is not None:
            step.done.synchronize()
        token_ids, logprobs = step.sampled.to_host(step.host)
        live = self.runner.states
        for request_id, (state, index), token_id, token_logprobs in zip(
            step.request_ids, step.placeholders, token_ids, logprobs
        ):
            if live.get(request_id) is not state:
                continue  # finished, aborted or preempted while in flight
            state.token_ids[index] = token_id
            step.output.sampled_token_ids[request_id] = [token_id]
            if token_logprobs is not None:
                step.output.logprobs[request_id] = [token_logprobs]
        return step.output

    def drop(self) -> None:
        self.collect(self.previous)
        self.previous = None

    # ------------------------------------------------------------ internals

    def _fill_placeholders(
        self, scheduler_output: SchedulerOutput, batch: PreparedBatch, previous: LaunchedSamples | None
    ) -> None:
        """Copy, on the device, the previous step's samples into this step's input ids."""
        if previous is None or previous.collected or previous.sampled is None:
            return
        states, placeholders = self.runner.states, previous.placeholders
        rows = previous.rows_by_request()
        query_start = batch.attn_batch.query_start_loc_cpu.tolist()
        destinations, sources = [], []
        for i, (request_id, num_tokens) in enumerate(scheduler_output.num_scheduled_tokens.items()):
            state = states[request_id]
            row = rows.get(request_id)
            # The same state object: a request preempted (or aborted and its id
            # reused) since has a new state, and its placeholder is gone.
            if row is None or placeholders[row][0] is not state:
                continue
            offset = placeholders[row][1] - state.num_computed_tokens
            if 0 <= offset < num_tokens:
                destinations.append(query_start[i] + offset)
                sources.append(row)
        if not destinations:
            return
        self.num_device_inputs += len(destinations)
        upload, device = self.runner.sampler.upload, batch.input_ids.device
        tokens = previous.sampled.token_ids.index_select(0, upload(sources, torch.long, device))
        batch.input_ids.index_copy_(0, upload(destinations, torch.long, device), tokens.to(batch.input_ids.dtype))

    def _launch_sampling(
        self, batch: PreparedBatch, logits: torch.Tensor | None, scheduler_output: SchedulerOutput
    ) -> LaunchedSamples:
        runner = self.runner
        request_ids = list(batch.sample_request_ids)
        if logits is None or not request_ids:
            return _finished(ModelRunnerOutput())
        # Grammar masks: the engine runs a step with constrained requests only
        # once every earlier step is collected, so they follow every token.
        allowed = runner.grammar_allowed(batch, scheduler_output)
        sampled = runner.sampler.sample(logits, runner.sampling_rows(request_ids), allowed)
        placeholders = []
        for request_id in request_ids:
            state = runner.states[request_id]
            placeholders.append((state, len(state.token_ids)))
            state.token_ids.append(PLACEHOLDER_TOKEN_ID)
        host, done = copy_to_host(sampled.tensors(), runner.platform)
        return LaunchedSamples(request_ids, placeholders, sampled, host, done)


class PendingStep:
    """What the executor hands the engine for a step launched without waiting."""

    def __init__(self, stepper: AsyncStepper, step: LaunchedSamples) -> None:
        self._stepper = stepper
        self._step = step

    def result(self) -> ModelRunnerOutput:
        return self._stepper.collect(self._step)


def _finished(output: ModelRunnerOutput) -> LaunchedSamples:
    return LaunchedSamples([], [], None, [], None, output, collected=True)
