"""The synchronous engine loop: add requests, ``step()`` until done.

One step is: schedule -> execute (through the ``Executor`` protocol) ->
update the scheduler -> detokenize and check stop strings -> outputs. Input is
validated in ``add_request`` so that bad input raises a typed error before
anything is scheduled.

An executor whose ``max_concurrent_batches`` is above 1 (pipeline stages)
gets up to that many batches before the engine waits for the oldest; each
``step()`` then returns the outputs of one batch, oldest first.

An executor with ``async_scheduling`` set runs steps asynchronously: each
``step()`` schedules and launches the next batch *before* collecting the
one in flight, so the host's scheduling, input preparation, output update
and detokenization overlap the device's work (``core/scheduler.py`` counts
the samples in flight as placeholders). The first ``step()`` of a run
returns no outputs; a request stopped by a stop string or aborted may have
had one more step launched, whose sample is dropped.

If the executor reports ``EngineDeadError`` (a worker died), every unfinished
request is finished with status ``error``, the executor is shut down, and the
error propagates; later calls raise it again.

A request with an output constraint (structured outputs) waits outside the
scheduler until its grammar is compiled (``StructuredOutputManager``), and
each scheduled batch carries the token masks of its constrained requests.

Failures that belong to one request stay with it: ``add_request`` either
queues all of a request's children or none (an error half-way takes back
what it queued), and an exception while turning one request's tokens into
output (detokenizing, stop strings) finishes that request with
``finish_reason="error"`` while the others go on. A failure of the batched
model step itself cannot be pinned on one request and propagates.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Callable
from typing import Any, NoReturn

from octavo.core.engine_limits import EngineLimits, ModelInfo
from octavo.core.executor import Executor
from octavo.core.lora_request import LoRARequest, request_cache_key
from octavo.core.output_processor import OutputProcessor, ParentRequest
from octavo.core.outputs import CompletionOutput, PoolingRequestOutput, RequestOutput
from octavo.core.engine_pooling import EnginePooling
from octavo.core.pooling_batch import POOLING_SAMPLING_PARAMS, TokenizerIdBound
from octavo.core.pooling_params import PoolingParams
from octavo.core.request import Request, RequestStatus
from octavo.core.request_validation import RequestValidator, check_priority, check_token_ids
from octavo.core.sampling_params import SamplingParams
from octavo.core.scheduler import Scheduler, SchedulerStats, check_admissible
from octavo.core.scheduler_output import CompilationCounts, EngineCoreOutput, ModelRunnerOutput, SchedulerOutput
from octavo.core.step_log import step_log_from_env
from octavo.core.structured_output.manager import StructuredOutputManager
from octavo.core.types import RequestId
from octavo.errors import EngineDeadError, InvalidArgumentError

# Importers of these from here predate their own modules.
__all__ = [
    "POOLING_SAMPLING_PARAMS", "EngineLimits", "LLMEngine", "ModelInfo", "RequestValidator", "check_priority",
    "check_token_ids", "child_requests", "failed_output",
]

logger = logging.getLogger(__name__)
# An engine with only requests waiting for their grammar waits this long for one.
GRAMMAR_POLL_S = 0.005


def failed_output(request_id: str) -> RequestOutput:
    """The last output of a request that failed in the engine (``finish_reason="error"``)."""
    completion = CompletionOutput(index=0, text="", token_ids=[], finish_reason="error")
    return RequestOutput(request_id=request_id, prompt=None, prompt_token_ids=[], outputs=[completion], finished=True)


def child_requests(request_id: str, params: SamplingParams) -> list[tuple[str, SamplingParams]]:
    """The ids and params of a request's ``n`` children: the request itself
    when ``n == 1``, else ``id#i``; seeded children get ``seed + i``."""
    if params.n == 1:
        return [(request_id, params)]
    children = []
    for index in range(params.n):
        child_params = params
        if params.seed is not None:
            child_params = params.clone()
            child_params.seed = params.seed + index
        children.append((f"{request_id}#{index}", child_params))
    return children


class LLMEngine(EnginePooling, RequestValidator):
    def __init__(
        self,
        executor: Executor,
        scheduler: Scheduler,
        tokenizer: Any | None,
        limits: EngineLimits,
        info: ModelInfo | None = None,
    ) -> None:
        self.executor = executor
        self.info = info
        self.scheduler = scheduler
        self.tokenizer = tokenizer
        self.limits = limits
        # The front end's image processing (``multimodal.ImagePrompts``), set by
        # ``build_engine`` for a model that takes images; the engine only checks features.
        self.image_prompts = None
        self.output_processor = OutputProcessor(tokenizer)
        self._parent_children: dict[str, list[str]] = {}
        self._counter = itertools.count()
        self.max_concurrent_batches = max(1, getattr(executor, "max_concurrent_batches", 1))
        # The scheduler must know how many batches can be in flight (it skips
        # their requests); the executor decides.
        scheduler.config.max_concurrent_batches = self.max_concurrent_batches
        scheduler.config.even_batches_in_flight = bool(getattr(executor, "even_batches_in_flight", True))
        self.async_scheduling = bool(getattr(executor, "async_scheduling", False))
        scheduler.config.async_scheduling = self.async_scheduling
        # Batches handed to the executor and not yet collected, oldest first.
        self._batches_in_flight: deque[tuple[SchedulerOutput, Any]] = deque()
        self._dead: EngineDeadError | None = None
        # Called with each batch's SchedulerOutput as its outputs are
        # processed; benchmarks set it to trace steps, OCTAVO_STEP_LOG to log
        # them (core/step_log.py); None: no cost.
        self.step_observer: Callable[[SchedulerOutput], None] | None = step_log_from_env(scheduler)
        # The workers' compilation counts, as of the last step's output.
        self.compilations = CompilationCounts()
        self._structured: StructuredOutputManager | None = None
        self.tokenizer_id_bound = TokenizerIdBound()

    @property
    def structured(self) -> StructuredOutputManager:
        if self._structured is None:
            self._structured = StructuredOutputManager(self.grammar_compiler)
        return self._structured

    # ------------------------------------------------------------------ input

    def add_request(
        self,
        request_id: str | None,
        prompt: str | list[int] | dict,
        params: SamplingParams | PoolingParams,
        cache_salt: str | None = None,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
    ) -> str:
        """Validate and queue a request; returns its id. Raises before scheduling.

        With ``PoolingParams`` the request is pooled (its output is a
        ``PoolingRequestOutput``); a dict prompt may then carry
        ``token_type_ids`` (BERT's segments of a text pair).
        ``priority`` orders the waiting queue under the priority scheduling
        policy (lower first); under fcfs it must be 0."""
        if self._dead is not None:
            raise self._dead
        check_priority(priority, self.scheduler.config.policy)
        if request_id is None:
            request_id = str(next(self._counter))
        if request_id in self._parent_children:
            raise InvalidArgumentError(f"request id {request_id!r} is already in use", param="request_id")
        prompt_text, prompt_token_ids = self.prepare_prompt(prompt, params)
        self.validate(prompt_token_ids, params)
        images = self.image_features(prompt, prompt_token_ids, params)
        self.check_lora_request(lora_request, pooling=isinstance(params, PoolingParams))
        if isinstance(params, PoolingParams):
            token_type_ids = prompt.get("token_type_ids") if isinstance(prompt, dict) else None
            self.validate_token_type_ids(prompt_token_ids, token_type_ids)
            return self._add_pooling_request(request_id, prompt_text, prompt_token_ids, params, token_type_ids)
        parent = ParentRequest(request_id, prompt_text, prompt_token_ids, params)
        children = self._make_children(request_id, prompt_token_ids, params, cache_salt, priority, lora_request, images)
        # Children are identical in size, so the first one's admission check
        # (KV capacity) decides for all of them before any is queued.
        constraint = params.structured_outputs
        if constraint is not None:
            # Queued once their grammar is compiled (``_admit_compiled``).
            scheduler = self.scheduler
            check_admissible(children[0], scheduler.config, scheduler.kv.num_blocks, scheduler.kv.block_size)
        queued: list[str] = []
        try:
            for index, request in enumerate(children):
                if constraint is None:
                    self.scheduler.add_request(request)
                else:
                    self.structured.add(request, constraint)
                queued.append(request.request_id)
                self.output_processor.add_request(request.request_id, index, parent, request.sampling_params)
        except BaseException:
            self._drop_children(queued, RequestStatus.FINISHED_ABORTED)
            raise
        self._parent_children[request_id] = [r.request_id for r in children]
        return request_id

    def _make_children(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, cache_salt: str | None, priority: int,
        lora_request: LoRARequest | None = None, images: tuple = (),
    ) -> list[Request]:
        """The scheduler's requests for a request's ``n`` children (``child_requests``)."""
        max_tokens = self.max_new_tokens(prompt_token_ids, params)
        return [
            Request(
                request_id=RequestId(child_id),
                prompt_token_ids=prompt_token_ids,
                sampling_params=child_params,
                eos_token_ids=self.limits.eos_token_ids,
                max_tokens=max_tokens,
                block_size=self.limits.block_size,
                cache_key=request_cache_key(cache_salt, lora_request),
                priority=priority,
                lora_request=lora_request,
                image_features=images,
            )
            for child_id, child_params in child_requests(request_id, params)
        ]

    def _drop_children(self, child_ids: list[str], status: RequestStatus) -> None:
        self.scheduler.finish_requests(child_ids, status)
        if self._structured is not None:
            self._structured.remove(set(child_ids))
        self.output_processor.abort(child_ids)

    def abort_request(self, request_ids: str | list[str]) -> None:
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        child_ids = []
        for request_id in request_ids:
            child_ids.extend(self._parent_children.pop(request_id, []))
        self._drop_children(child_ids, RequestStatus.FINISHED_ABORTED)
        if self._batches_in_flight and not self.has_unfinished_requests():
            self._drain_batches_in_flight()

    def _drain_batches_in_flight(self) -> None:
        """Collect the batches still in flight when every request has ended
        (all aborted, e.g. after an error in an ``LLM`` call): their outputs
        belong to no one, but the engine and its scheduler must not hold
        them past the idle point (an overlapped pooling step's pinned rows,
        a pipeline stage's batch)."""
        while self._batches_in_flight:
            scheduler_output, pending = self._batches_in_flight.popleft()
            try:
                self._process(scheduler_output, pending.result())
            except EngineDeadError as exc:
                self._fail(exc)

    # ------------------------------------------------------------------- loop

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or bool(self._structured and self._structured.awaiting)

    def step(self) -> list[RequestOutput | PoolingRequestOutput]:
        if self._dead is not None:
            raise self._dead
        failed = self._admit_compiled()
        if failed:
            return failed
        if self.max_concurrent_batches > 1:
            return self._step_pipelined()
        if self.async_scheduling:
            return self._step_async()
        if not self.scheduler.has_unfinished_requests():
            return []
        scheduler_output = self._schedule()
        if scheduler_output.is_empty:
            return []
        self.output_processor.mark_scheduled(scheduler_output)
        try:
            runner_output = self.executor.execute_model(scheduler_output)
        except EngineDeadError as exc:
            self._fail(exc)
        return self._process(scheduler_output, runner_output)

    def _step_pipelined(self) -> list[RequestOutput]:
        """Keep up to ``max_concurrent_batches`` in flight; finish the oldest."""
        try:
            while len(self._batches_in_flight) < self.max_concurrent_batches and self.scheduler.has_unfinished_requests():
                scheduler_output = self._schedule()
                if scheduler_output.is_empty:
                    break  # every schedulable request is already in flight
                self.output_processor.mark_scheduled(scheduler_output)
                pending = self.executor.execute_model(scheduler_output, non_block=True)
                self._batches_in_flight.append((scheduler_output, pending))
            if not self._batches_in_flight:
                return []
            scheduler_output, pending = self._batches_in_flight.popleft()
            runner_output = pending.result()
        except EngineDeadError as exc:
            self._fail(exc)
        return self._process(scheduler_output, runner_output)

    def _schedule(self) -> SchedulerOutput:
        scheduler_output = self.scheduler.schedule()
        if self._structured is not None and not scheduler_output.is_empty:
            scheduler_output.grammar_bitmask = self._structured.bitmask(
                scheduler_output, self.scheduler.requests, counted=self.async_scheduling
            )
        return scheduler_output

    def _admit_compiled(self) -> list[RequestOutput]:
        """Queue the requests whose grammar is ready; error out those whose
        grammar failed. Returns the failed requests' outputs."""
        structured = self._structured
        if structured is None or not structured.awaiting:
            return []
        if not self.scheduler.has_unfinished_requests():
            structured.wait_for_any(GRAMMAR_POLL_S)  # nothing else to do meanwhile
        ready, failed = structured.take_ready()
        for request in ready:
            self.scheduler.add_request(request)
        errors = []
        for request, problem in failed:
            logger.warning("request %s failed: its constraint %s", request.request_id, problem)
            request.status = RequestStatus.FINISHED_ERROR
            errors.append(EngineCoreOutput(request.request_id, [], finish_reason=request.status.finish_reason))
        return self._failed_outputs(errors) if errors else []

    def _failed_outputs(self, errors: list[EngineCoreOutput]) -> list[RequestOutput]:
        """The outputs of requests that ended before they were scheduled."""
        outputs, _ = self._process_outputs(errors)
        for output in outputs:
            if output.finished:
                self._parent_children.pop(output.request_id, None)
        return outputs

    def _step_async(self) -> list[RequestOutput]:
        """Launch the next batch, then finish the one launched before it;
        one batch at a time while a constrained request runs (its next mask
        follows every token it sampled before)."""
        try:
            launched = False
            in_step_order = self._constrained_running()
            if in_step_order and self._batches_in_flight:
                pass  # finish the batch in flight before the next is scheduled
            elif self.scheduler.has_unfinished_requests():
                scheduler_output = self._schedule()
                if not scheduler_output.is_empty:
                    self.output_processor.mark_scheduled(scheduler_output)
                    pending = self.executor.execute_model(scheduler_output, non_block=True)
                    self._batches_in_flight.append((scheduler_output, pending))
                    launched = True
            # Keep the batch just launched in flight unless nothing new could go.
            if len(self._batches_in_flight) < (2 if launched and not in_step_order else 1):
                return []
            scheduler_output, pending = self._batches_in_flight.popleft()
            runner_output = pending.result()
        except EngineDeadError as exc:
            self._fail(exc)
        return self._process(scheduler_output, runner_output)

    def _constrained_running(self) -> bool:
        """Whether a running request has a structured-output grammar."""
        return self._structured is not None and any(r.grammar is not None for r in self.scheduler.running)

    def _process(self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput) -> list[RequestOutput]:
        if runner_output.compilations is not None:
            self.compilations = runner_output.compilations
        if self.step_observer is not None:
            self.step_observer(scheduler_output)
        pooling = self.scheduler.finish_pooling_step(scheduler_output, runner_output)
        if pooling is not None:
            # Straight to the outputs, without an EngineCoreOutput per input: one
            # object each from state already held, nothing to fail for one alone.
            request_outputs = self.output_processor.pooling_outputs(pooling)
            for output in request_outputs:
                self._parent_children.pop(output.request_id, None)
            return request_outputs
        core_outputs = self.scheduler.update_from_output(scheduler_output, runner_output)
        request_outputs, stopped = self._process_outputs(core_outputs)
        if stopped:
            self.scheduler.finish_requests(stopped, RequestStatus.FINISHED_STOPPED)
        for output in request_outputs:
            if output.finished:
                self._parent_children.pop(output.request_id, None)
        return request_outputs

    def _process_outputs(self, core_outputs: list[EngineCoreOutput]) -> tuple[list[RequestOutput], list[str]]:
        """The output processor's work; a request whose processing raises fails alone."""
        return self.output_processor.process(core_outputs, on_error=self._fail_request)

    def _fail_request(self, child_id: str) -> RequestOutput:
        """Finish the whole request that ``child_id`` belongs to with ``finish_reason="error"``."""
        state = self.output_processor.states.get(child_id)
        parent_id = state.parent.request_id if state is not None else child_id
        logger.exception("request %s failed in the engine; the engine goes on without it", parent_id)
        child_ids = self._parent_children.pop(parent_id, [child_id])
        self._drop_children(child_ids, RequestStatus.FINISHED_ERROR)
        return failed_output(parent_id)

    def _fail(self, error: EngineDeadError) -> NoReturn:
        """A worker died: error out every request, release the workers, raise."""
        self._dead = error
        error.failed_request_ids = list(self._parent_children)
        self._batches_in_flight.clear()
        request_ids = [r.request_id for r in [*self.scheduler.running, *self.scheduler.waiting]]
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ERROR)
        if self._structured is not None:
            request_ids += [r.request_id for r in self._structured.awaiting]
            self._structured.awaiting.clear()
        self.output_processor.abort(request_ids)
        self._parent_children.clear()
        self.executor.shutdown()
        raise error

    def check_health(self) -> None:
        """Raise ``EngineDeadError`` if the engine or one of its workers is dead."""
        if self._dead is not None:
            raise self._dead
        self.executor.check_health()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (vLLM's); False, and nothing forgotten, while a request holds blocks."""
        return self.scheduler.kv.reset_prefix_cache()

    def get_stats(self) -> SchedulerStats:
        stats = self.scheduler.get_stats()
        stats.compilations = self.compilations
        return stats

    def shutdown(self) -> None:
        self._batches_in_flight.clear()
        if self._structured is not None:
            self._structured.shutdown()
        self.executor.shutdown()
