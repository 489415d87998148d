"""Overlapping the host's work with the device's: the next decode step is
launched before this one's tokens reach the host.

In a run of plain greedy decode steps, step N+1's inputs are step N's
outputs, which already sit on the device. So when step N is launched (or
found already computed), the runner immediately launches a speculative step
N+1 for the same requests, one position further, feeding it step N's sampled
tokens on the device, and only then waits for step N's tokens. While the
device computes N+1, the host returns N's tokens, updates the scheduler,
detokenizes and schedules N+1. When the scheduler's real step N+1 arrives it
is usually the speculated one (same requests, each one token further): its
tokens are already being computed. A request that finished meanwhile is
simply not taken from the speculated batch.

Why it is safe: the speculated step only writes the KV of each request's
next position, into a block the scheduler already gave it (it allocates one
token of lookahead), never into a prefix-cache block (those hold computed
tokens only); when the real step differs, it is computed afresh and the
speculation is dropped (its work wasted, its writes harmless: stream order
puts them before any later write or read). The tokens are the ones the plain
path would sample: the same graph, the same greedy argmax.

Grammar-constrained requests (structured outputs) overlap too: only the
forward pass of the speculated step is launched; its logits wait on the
device for the step's grammar masks, which the engine computes from step N's
tokens while the device runs step N+1. The real step then applies them and
takes the argmax, before it launches step N+2.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from octavo.core.scheduler_output import ModelRunnerOutput, SchedulerOutput
from octavo.runtime.input_batch import PreparedBatch
from octavo.runtime.sampler import apply_token_bitmask_


@dataclass
class LaunchedStep:
    """A decode step on its way: its requests, their positions, its samples."""

    request_ids: list[str]
    positions: dict[str, int]  # the position each request computes
    logits: torch.Tensor | None = None  # kept until sampled (grammar masks come later)
    device_tokens: torch.Tensor | None = None  # [num_reqs] sampled token ids, on the device
    host_tokens: torch.Tensor | None = None  # pinned copy, valid once ``done`` has fired
    done: object | None = None  # a device event, None where copies are synchronous

    @property
    def sampled(self) -> bool:
        return self.device_tokens is not None

    def tokens(self) -> list[int]:
        if self.done is not None:
            self.done.synchronize()
        return self.host_tokens.tolist()


class DecodeOverlap:
    def __init__(self, runner) -> None:
        self.runner = runner
        self.pending: LaunchedStep | None = None
        self.num_reused = 0
        self.num_dropped = 0

    # ------------------------------------------------------------- decision

    def eligible(self, scheduler_output: SchedulerOutput) -> bool:
        """A plain greedy decode step: one token each, no logprobs or penalties."""
        if scheduler_output.total_num_scheduled_tokens != len(scheduler_output.num_scheduled_tokens):
            return False
        states = self.runner.states
        for request_id in scheduler_output.num_scheduled_tokens:
            state = states[request_id]
            num_tokens = len(state.token_ids)
            if not state.plain_greedy or state.num_computed_tokens + 1 != num_tokens:
                return False
            min_tokens = state.sampling_params.min_tokens
            if min_tokens and num_tokens - len(state.prompt_token_ids) < min_tokens:
                return False
        return True

    def _covers(self, scheduler_output: SchedulerOutput) -> bool:
        pending = self.pending
        if pending is None or scheduler_output.new_requests:
            return False
        states = self.runner.states
        return all(
            pending.positions.get(r) == states[r].num_computed_tokens for r in scheduler_output.num_scheduled_tokens
        )

    def _continuing(self, request_ids: list[str]) -> list[str]:
        """Requests that do not reach ``max_tokens`` with this step's token.

        The others finish now: computing a step for them would only delay
        whatever the device runs next (a new prompt's first token)."""
        states = self.runner.states
        continuing = []
        for request_id in request_ids:
            state = states[request_id]
            max_tokens = state.sampling_params.max_tokens
            num_outputs_after = len(state.token_ids) - len(state.prompt_token_ids) + 1
            if max_tokens is None or num_outputs_after < max_tokens:
                continuing.append(request_id)
        return continuing

    def _can_speculate(self, request_ids: list[str]) -> bool:
        runner = self.runner
        block_size, max_len = runner.config.block_size, runner.config.max_model_len
        for request_id in request_ids:
            state = runner.states[request_id]
            next_position = state.num_computed_tokens + 1
            if next_position >= max_len or next_position // block_size >= state.num_blocks:
                return False
        return True

    # -------------------------------------------------------------- running

    def execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        request_ids = list(scheduler_output.num_scheduled_tokens)
        if self._covers(scheduler_output):
            step = self.pending
            self.num_reused += 1
        else:
            if self.pending is not None:
                self.num_dropped += 1
            step = self._launch_planned(scheduler_output)
        if not step.sampled:
            self._sample(step, scheduler_output)
        continuing = self._continuing(request_ids)
        self.pending = self._launch_next(continuing, step) if continuing and self._can_speculate(continuing) else None
        tokens = step.tokens()
        if step.request_ids == request_ids:  # the usual case: the same requests, in order
            return ModelRunnerOutput(sampled_token_ids={r: [t] for r, t in zip(request_ids, tokens)})
        row = {request_id: index for index, request_id in enumerate(step.request_ids)}
        return ModelRunnerOutput(sampled_token_ids={r: [tokens[row[r]]] for r in request_ids})

    def drop(self) -> None:
        """Forget the speculation (the next step is not a plain decode step)."""
        if self.pending is not None:
            self.num_dropped += 1
        self.pending = None

    def _launch_planned(self, scheduler_output: SchedulerOutput) -> LaunchedStep:
        runner = self.runner
        graph_size = runner.graphs.padded_size(len(scheduler_output.num_scheduled_tokens)) if runner.graphs else None
        batch = runner.inputs.prepare(scheduler_output, padded_num_reqs=graph_size)
        states = runner.states
        positions = {r: states[r].num_computed_tokens for r in batch.sample_request_ids}
        return self._run(batch, graph_size, positions, sample=False)

    def _launch_next(self, request_ids: list[str], step: LaunchedStep) -> LaunchedStep:
        runner = self.runner
        states = runner.states
        positions = np.fromiter((states[r].num_computed_tokens + 1 for r in request_ids), np.int64, len(request_ids))
        if request_ids == step.request_ids:
            tokens = step.device_tokens
        else:
            index = {r: i for i, r in enumerate(step.request_ids)}
            gather = torch.tensor([index[r] for r in request_ids], dtype=torch.int64)
            if step.device_tokens.device.type != "cpu" and runner.platform.pins_host_memory:
                # From pinned memory, asynchronously: a pageable copy would
                # wait for the device to finish the running step.
                gather = gather.pin_memory().to(step.device_tokens.device, non_blocking=True)
            else:
                gather = gather.to(step.device_tokens.device)
            tokens = step.device_tokens.index_select(0, gather)
        graph_size = runner.graphs.padded_size(len(request_ids)) if runner.graphs else None
        batch = runner.inputs.prepare_decode_from_device(request_ids, positions, tokens, graph_size)
        # Constrained requests need the step's masks first: sample when it is asked for.
        sample = not any(runner.states[r].sampling_params.structured_outputs for r in request_ids)
        return self._run(batch, graph_size, dict(zip(request_ids, positions.tolist())), sample)

    def _run(self, batch: PreparedBatch, graph_size: int | None, positions: dict[str, int], sample: bool) -> LaunchedStep:
        runner = self.runner
        num_reqs = batch.attn_batch.num_reqs
        if graph_size is not None:
            logits = runner.graphs.replay(graph_size, num_reqs)
        else:
            hidden = runner.run_model(batch)
            logits = runner.model.compute_logits(hidden[:num_reqs])
        step = LaunchedStep(list(batch.sample_request_ids), positions, logits)
        if sample:
            self._sample(step, None)
        return step

    def _sample(self, step: LaunchedStep, scheduler_output: SchedulerOutput | None) -> None:
        """Greedy tokens of ``step`` under its grammar masks, and their copy to the host."""
        logits, step.logits = step.logits, None
        if scheduler_output is not None and scheduler_output.grammar_bitmask is not None:
            rows = {request_id: row for row, request_id in enumerate(step.request_ids)}
            allowed = self.runner.grammar_masks.upload(scheduler_output.grammar_bitmask, rows)
            if allowed is not None:
                logits = apply_token_bitmask_(logits, allowed)
        step.device_tokens = logits.argmax(dim=-1)
        # An asynchronous copy needs pinned memory and an event to wait on,
        # both from the platform; otherwise the copy waits for the step.
        platform = self.runner.platform
        done = platform.create_event() if step.device_tokens.device.type != "cpu" else None
        asynchronous = done is not None and platform.pins_host_memory
        step.host_tokens = torch.empty(len(step.request_ids), dtype=torch.int64, pin_memory=asynchronous)
        step.host_tokens.copy_(step.device_tokens, non_blocking=asynchronous)
        if asynchronous:
            done.record()
            step.done = done
