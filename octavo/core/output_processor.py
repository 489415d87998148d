"""Turns the scheduler's per-step token updates into ``RequestOutput``s.

Owns one ``RequestState`` per (child) request: its detokenizer, logprobs and
timings. A request with ``n > 1`` is ``n`` child requests that share a
``ParentRequest``, which assembles their outputs into one ``RequestOutput``.
Stop strings are found here (they need text); the engine then tells the
scheduler to finish those requests. A pooling request has no tokens to
decode: its one output carries the pooled vector (``PoolingRequestOutput``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from octavo.core.detokenizer import IncrementalDetokenizer
from octavo.core.outputs import (
    CompletionOutput,
    Logprob,
    PoolingOutput,
    PoolingRequestOutput,
    PromptLogprobs,
    RequestMetrics,
    RequestOutput,
    SampleLogprobs,
)
from octavo.core.sampling_params import RequestOutputKind, SamplingParams
from octavo.core.scheduler_output import EngineCoreOutput, PoolingResult, SchedulerOutput, TokenLogprobs


@dataclass
class ParentRequest:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    child_outputs: dict[int, CompletionOutput] = field(default_factory=dict)
    num_finished: int = 0
    prompt_logprobs: PromptLogprobs | None = None
    num_cached_tokens: int = 0

    @property
    def finished(self) -> bool:
        return self.num_finished == self.params.n


@dataclass
class RequestState:
    request_id: str
    index: int  # position among the parent's n outputs
    parent: ParentRequest
    params: SamplingParams
    detokenizer: IncrementalDetokenizer | None
    metrics: RequestMetrics
    token_ids: list[int] = field(default_factory=list)
    logprobs: SampleLogprobs | None = None
    cumulative_logprob: float | None = None
    num_sent_tokens: int = 0


@dataclass(slots=True)
class PoolingState:
    prompt: str | None
    prompt_token_ids: list[int]
    metrics: RequestMetrics


class OutputProcessor:
    def __init__(self, tokenizer: Any | None) -> None:
        self.tokenizer = tokenizer
        self.states: dict[str, RequestState] = {}
        self.pooling_states: dict[str, PoolingState] = {}

    def add_pooling_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int]) -> None:
        metrics = RequestMetrics(arrival_time=time.monotonic())
        self.pooling_states[request_id] = PoolingState(prompt, prompt_token_ids, metrics)

    def add_pooling_requests(
        self, request_ids: list[str], prompts: list[str | None], prompt_token_ids: list[list[int]]
    ) -> None:
        """``add_pooling_request`` for a batch (one arrival time)."""
        now, states = time.monotonic(), self.pooling_states
        for request_id, prompt, token_ids in zip(request_ids, prompts, prompt_token_ids):
            states[request_id] = PoolingState(prompt, token_ids, RequestMetrics(arrival_time=now))

    def add_request(self, request_id: str, index: int, parent: ParentRequest, params: SamplingParams) -> None:
        detokenizer = None
        if self.tokenizer is not None and params.detokenize:
            detokenizer = IncrementalDetokenizer(self.tokenizer, parent.prompt_token_ids, params)
        self.states[request_id] = RequestState(
            request_id=request_id,
            index=index,
            parent=parent,
            params=params,
            detokenizer=detokenizer,
            metrics=RequestMetrics(arrival_time=time.monotonic(), sequence_index=index),
            logprobs=[] if params.logprobs is not None else None,
            cumulative_logprob=0.0 if params.logprobs is not None else None,
        )
        if params.prompt_logprobs is not None and parent.prompt_logprobs is None:
            parent.prompt_logprobs = [None]

    def mark_scheduled(self, scheduler_output: SchedulerOutput) -> None:
        """Stamp ``first_scheduled_time`` on requests scheduled for the first time (queue time ends)."""
        now = time.monotonic()
        for new in scheduler_output.new_requests:
            state = self.states.get(new.request_id)
            if state is not None and state.metrics.first_scheduled_time is None:
                state.metrics.first_scheduled_time = now

    def abort(self, request_ids: list[str]) -> list[str]:
        """Drop states; return the parent ids they belonged to."""
        parents = []
        for request_id in request_ids:
            if self.pooling_states.pop(request_id, None) is not None:
                parents.append(request_id)
                continue
            state = self.states.pop(request_id, None)
            if state is not None:
                parents.append(state.parent.request_id)
        return parents

    def process(
        self,
        core_outputs: list[EngineCoreOutput],
        on_error: Callable[[str], RequestOutput] | None = None,
    ) -> tuple[list[RequestOutput | PoolingRequestOutput], list[str]]:
        """Return the outputs to hand out and the ids that hit a stop string.

        With ``on_error``, a request whose processing raises fails alone: its
        place in the outputs goes to ``on_error(request_id)`` and the others
        go on; without it, the exception propagates."""
        request_outputs: list[RequestOutput | PoolingRequestOutput] = []
        stopped_by_string: list[str] = []
        now = time.monotonic()
        for core_output in core_outputs:
            if on_error is None:
                output, stopped = self._process_one(core_output, now)
            else:
                try:
                    output, stopped = self._process_one(core_output, now)
                except Exception:
                    request_outputs.append(on_error(core_output.request_id))
                    continue
            if stopped:
                stopped_by_string.append(core_output.request_id)
            if output is not None:
                request_outputs.append(output)
        return request_outputs, stopped_by_string

    def pooling_outputs(self, results: list[PoolingResult]) -> list[PoolingRequestOutput]:
        """The outputs of a pooling step's results, in one pass (``LLMEngine._process``)."""
        now, states, outputs = time.monotonic(), self.pooling_states, []
        for request_id, pooled, _ in results:
            state = states.pop(request_id, None)
            if state is None:
                continue
            # ``_pooling_output`` inline, its objects made positionally: this runs per input.
            state.metrics.finished_time = now
            output = None if pooled is None else PoolingOutput(pooled)
            finish_reason = "stop" if pooled is not None else "error"
            outputs.append(
                PoolingRequestOutput(request_id, state.prompt, state.prompt_token_ids, output, True, finish_reason, state.metrics)
            )
        return outputs

    def _process_one(
        self, core_output: EngineCoreOutput, now: float
    ) -> tuple[RequestOutput | PoolingRequestOutput | None, bool]:
        """One request's progress: its output, if one is due now, and whether a
        stop string ended it here (the scheduler must then be told)."""
        pooling = self.pooling_states.pop(core_output.request_id, None)
        if pooling is not None:
            output = self._pooling_output(core_output.request_id, core_output.pooled, core_output.finish_reason, pooling, now)
            return output, False
        state = self.states.get(core_output.request_id)
        if state is None:
            return None, False
        finish_reason, stop_reason = core_output.finish_reason, core_output.stop_reason
        stop_string = self._update_state(state, core_output, now)
        stopped = False
        if stop_string is not None:
            stopped = finish_reason is None
            finish_reason, stop_reason = "stop", stop_string
        if finish_reason is not None:
            state.metrics.finished_time = now
            del self.states[state.request_id]
        return self._make_output(state, finish_reason, stop_reason), stopped

    @staticmethod
    def _pooling_output(
        request_id: str, pooled: bytes | None, finish_reason: str | None, state: PoolingState, now: float
    ) -> PoolingRequestOutput:
        metrics = state.metrics
        metrics.finished_time = now
        return PoolingRequestOutput(
            request_id=request_id,
            prompt=state.prompt,
            prompt_token_ids=state.prompt_token_ids,
            outputs=PoolingOutput(pooled) if pooled is not None else None,
            finish_reason=finish_reason or "stop",
            metrics=metrics,
        )

    def _update_state(self, state: RequestState, core_output: EngineCoreOutput, now: float) -> str | None:
        parent = state.parent
        if core_output.new_prompt_logprobs and parent.prompt_logprobs is not None and state.index == 0:
            parent.prompt_logprobs.extend(self._to_logprob_dicts(core_output.new_prompt_logprobs))
        parent.num_cached_tokens = core_output.num_cached_tokens
        metrics = state.metrics
        if core_output.first_scheduled_time is not None and metrics.first_scheduled_time is None:
            metrics.first_scheduled_time = core_output.first_scheduled_time
        new_token_ids = core_output.new_token_ids
        if new_token_ids:
            if metrics.first_token_time is None:
                metrics.first_token_time = now
            metrics.last_token_time = now
            metrics.num_generation_tokens += len(new_token_ids)
            state.token_ids.extend(new_token_ids)
        if state.logprobs is not None and core_output.new_logprobs:
            state.logprobs.extend(self._to_logprob_dicts(core_output.new_logprobs))
            state.cumulative_logprob += sum(entry.logprobs[0] for entry in core_output.new_logprobs)
        if state.detokenizer is None:
            return None
        check_stop = len(state.token_ids) >= state.params.min_tokens
        stop_string = state.detokenizer.update(new_token_ids, check_stop)
        if stop_string is not None:
            # Tokens after the one that completed the stop string are dropped.
            num_kept = len(state.detokenizer.token_ids)
            if state.logprobs is not None:
                # The cumulative logprob covers the kept tokens only.
                dropped = zip(state.token_ids[num_kept:], state.logprobs[num_kept:])
                state.cumulative_logprob -= sum(entry[token_id].logprob for token_id, entry in dropped)
                del state.logprobs[num_kept:]
            del state.token_ids[num_kept:]
        return stop_string

    def _to_logprob_dicts(self, entries: list[TokenLogprobs]) -> list[dict[int, Logprob]]:
        result = []
        for entry in entries:
            position: dict[int, Logprob] = {}
            for token_id, logprob, rank in zip(entry.token_ids, entry.logprobs, entry.ranks):
                if token_id not in position:
                    position[token_id] = Logprob(logprob, rank, self._decode_token(token_id))
            result.append(position)
        return result

    def _decode_token(self, token_id: int) -> str | None:
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode([token_id])

    def _make_output(self, state: RequestState, finish_reason: str | None, stop_reason) -> RequestOutput | None:
        # Runs for every request of every step: identity tests on the kind,
        # positional construction (a streaming step builds one output per request).
        params, parent = state.params, state.parent
        kind = params.output_kind
        finished = finish_reason is not None
        final_only = kind is RequestOutputKind.FINAL_ONLY
        if final_only and not finished:
            return None
        delta = kind is RequestOutputKind.DELTA
        completion = self._completion(state, finished, delta, finish_reason, stop_reason)
        parent.child_outputs[state.index] = completion
        if finished:
            parent.num_finished += 1
        parent_finished = parent.finished
        if final_only and not parent_finished:
            return None
        if delta:
            outputs = [completion]
        else:
            outputs = [parent.child_outputs[i] for i in sorted(parent.child_outputs)]
        return RequestOutput(
            parent.request_id, parent.prompt, parent.prompt_token_ids, outputs, parent_finished,
            parent.prompt_logprobs, parent.num_cached_tokens, state.metrics,
        )

    def _completion(self, state: RequestState, finished: bool, delta: bool, finish_reason, stop_reason):
        text = ""
        if state.detokenizer is not None:
            text = state.detokenizer.get_next_output_text(finished, delta)
        # Copies (the output outlives this step; the state's lists keep growing), one each.
        logprobs = state.logprobs
        if delta:
            num_sent = state.num_sent_tokens
            token_ids = state.token_ids[num_sent:]
            if logprobs is not None:
                logprobs = logprobs[num_sent:]
            state.num_sent_tokens = len(state.token_ids)
        else:
            token_ids = list(state.token_ids)
            if logprobs is not None:
                logprobs = list(logprobs)
        return CompletionOutput(
            state.index, text, token_ids, state.cumulative_logprob, logprobs, finish_reason, stop_reason
        )
