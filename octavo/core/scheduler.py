"""The scheduler: each step, how many tokens each request computes.

There are no prefill and decode phases. Every request has ``num_tokens``
(prompt plus output so far) and ``num_computed_tokens`` (tokens whose KV is in
the cache); a step assigns ``{request_id: num_new_tokens}`` under a token
budget so that the second catches up with the first. A whole prompt, a chunk
of one, a prompt after a prefix-cache hit, and a single decode token are all
the same rule.

Order: running requests first (oldest first), then waiting ones in the
order of the scheduling policy (``core/request_queue.py``): ``fcfs`` (FIFO,
the default) or ``priority`` (lowest ``priority`` value first, then
arrival). When blocks run out, a running request is preempted: its blocks
are freed and it goes back to the waiting queue, to be recomputed (its
prefix-cache hits make that cheap). The victim is the newest request
(``fcfs``) or the lowest-priority one, newest among equals (``priority``).
Under ``priority``, a waiting request that cannot start (no free sequence
slot or too few free blocks for its first chunk) also preempts running
requests of strictly lower priority, lowest first, before the step is
scheduled.

Batches in flight (pipeline parallelism): an executor may hold up to
``max_concurrent_batches`` scheduled batches before the first one's output
comes back. A request belongs to at most one batch in flight: ``schedule()``
skips it (and never preempts it) until ``update_from_output`` has seen its
batch. To keep every stage busy, each batch then takes at most its share of
the schedulable requests (``ceil(schedulable / free batch slots)``). With
one batch at a time (the default) none of this changes anything.

Pooling requests (embeddings, classification) follow the same rule with two
constraints: a prompt is never chunked (it is scheduled whole, when the
step's budget has room for it, so its pooled vector sees every token), and
it finishes in the step that computes it, with the vector the runner
pooled. An encoder-only model keeps no KV cache (``uses_kv_cache=False``):
its requests take no blocks at all.

Async scheduling (``async_scheduling``): the engine schedules step N+1
before step N's samples come back. A request's tokens are then counted as
computed when they are scheduled, and each sample of a batch in flight is a
*placeholder* (``Request.num_output_placeholders``): step N+1 computes the
token step N samples without knowing it (the runner feeds it from the
device). Requests in flight may be scheduled and preempted: every batch
runs in order on one device stream, so a later batch always sees what an
earlier one wrote, and a sample that arrives for a request finished,
aborted or preempted since is dropped. A request whose placeholders already
reach its last token (``max_tokens``, ``max_model_len``) is not scheduled
again. The runner appends its own samples (it sampled them), so deltas carry
no token ids.

LoRA (``max_loras`` > 0): the runner holds ``max_loras`` adapters at once, so
a waiting request starts only if its adapter is already running or fewer
than ``max_loras`` distinct adapters are; one that cannot is set aside for
this step and goes back to the head of the queue in its order.

Speculative decoding (``speculative``): a caught-up running request may
carry draft tokens (``speculative_drafts.py`` says which and how many),
scheduled after its next token and listed in ``spec_token_ids``; its
rejected drafts are taken back off ``num_computed_tokens``.

Beside this file: ``scheduler_config.py`` (options, statistics, admission),
``runner_view.py`` (what the runner has been sent), ``stop_check.py`` (whether
a sampled token ends a request), ``scheduler_preemption.py`` (blocks for a
step, and who is preempted when they run out) and ``scheduler_pooling.py``
(pooling batches).
"""

from __future__ import annotations

from collections import deque

from octavo.core.kv_cache_manager import KVCacheManager
from octavo.core.request import Request, RequestStatus
from octavo.core.request_queue import make_waiting_queue
from octavo.core.runner_view import RunnerView
from octavo.core.scheduler_pooling import PoolingSteps
from octavo.core.scheduler_preemption import BlockAllocation
from octavo.core.scheduler_config import SchedulerConfig, SchedulerStats, check_admissible
from octavo.core.scheduler_output import EngineCoreOutput, ModelRunnerOutput, SchedulerOutput
from octavo.core.speculative_drafts import SpeculativeDrafts
from octavo.core.stop_check import check_stop
from octavo.core.types import RequestId

__all__ = ["Scheduler", "SchedulerConfig", "SchedulerStats", "check_admissible"]


class Scheduler(BlockAllocation, PoolingSteps):
    def __init__(self, config: SchedulerConfig, kv_cache_manager: KVCacheManager) -> None:
        self.config = config
        self.kv = kv_cache_manager
        self.requests: dict[RequestId, Request] = {}
        self.waiting = make_waiting_queue(config.policy)
        self.running: list[Request] = []
        self.num_preemptions = 0
        # What the runner holds for each request, and what to drop next step.
        self.runner_view = RunnerView(kv_cache_manager, config)
        self._preempted_last = False
        # Batches whose output has not come back, oldest first, with the
        # Request objects they hold (objects, not ids: an id can be reused
        # after an abort while the old request's batch is still in flight).
        self._in_flight: deque[tuple[SchedulerOutput, dict[str, Request]]] = deque()
        # Async scheduling, per batch in flight (by id of its output): each
        # request's computed tokens once the batch is done, whether it samples
        # a placeholder, and its preemption count when scheduled.
        self._async_batches: dict[int, dict[str, tuple[int, bool, int]]] = {}
        # Speculative decoding's proposer and counters (None: off).
        self.drafts = SpeculativeDrafts(config.speculative, config.max_model_len) if config.speculative is not None else None

    # ------------------------------------------------------------------ input

    def add_request(self, request: Request) -> None:
        """Queue a request; refuse one that could never fit in the KV cache."""
        check_admissible(request, self.config, self.kv.num_blocks, self.kv.block_size)
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        self.requests[request.request_id] = request
        self.waiting.add(request)

    def finish_requests(self, request_ids: list[str], status: RequestStatus) -> list[Request]:
        """End requests from outside (abort, stop string, error)."""
        finished = []
        for request_id in request_ids:
            request = self.requests.get(RequestId(request_id))
            if request is None or request.is_finished:
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
            request.status = status
            self._release(request)
            finished.append(request)
        return finished

    # --------------------------------------------------------------- schedule

    def schedule(self) -> SchedulerOutput:
        if self.config.max_concurrent_batches <= 1 and not self.config.async_scheduling:
            # One batch at a time: a new step retires the previous batch even
            # if its execution raised (its requests are then simply rescheduled).
            self._in_flight.clear()
        output = SchedulerOutput()
        token_budget = self.config.max_num_batched_tokens
        preempted_this_step = False
        if self.config.policy == "priority":
            self._preempt_for_waiting_priority()
        max_requests = self._batch_request_cap()
        # The scheduled requests by id, in batch order (kept with the batch in flight).
        requests: dict[str, Request] = {}
        token_budget, preempted_this_step = self._schedule_running(output, requests, token_budget, max_requests)
        if not preempted_this_step:
            token_budget = self._schedule_waiting(output, requests, token_budget, max_requests)

        self.runner_view.describe(output, requests)
        if output.num_scheduled_tokens:
            self._in_flight.append((output, requests))
            if self.config.async_scheduling:
                self._advance_scheduled(output, requests)
        return output

    def _schedule_running(
        self, output: SchedulerOutput, requests: dict[str, Request], token_budget: int, max_requests: int
    ) -> tuple[int, bool]:
        """Schedule running requests, oldest first; returns the budget left
        and whether a request was preempted."""
        # Locals, and the checks that hold for nearly every request inlined
        # (no pending placeholders, nothing in flight, a last block with room):
        # at 512 decoding requests this loop is a large part of a step's host work.
        running, scheduled = self.running, output.num_scheduled_tokens
        # Only pipelined batches hold their requests (``_held_by_batch``).
        check_held = bool(self._in_flight) and not self.config.async_scheduling
        tables = self.kv.req_to_blocks if self.config.uses_kv_cache else None
        block_size, lookahead = self.kv.block_size, self.config.num_lookahead_tokens
        preempted_this_step = False
        drafting = self.drafts is not None and self.drafts.enabled_for(len(running))
        long_prefill = self.config.long_prefill_token_threshold
        index = 0
        while index < len(running) and token_budget > 0 and len(scheduled) < max_requests:
            request = running[index]
            index += 1
            num_placeholders = request.num_output_placeholders
            num_new_tokens = len(request.all_token_ids) + num_placeholders - request.num_computed_tokens
            if 0 < long_prefill < num_new_tokens:
                num_new_tokens = long_prefill
            if num_new_tokens > token_budget:
                num_new_tokens = token_budget
            drafts = None
            if drafting and num_new_tokens == 1 and not num_placeholders:
                drafts = self.drafts.propose_for(request, token_budget - 1, self.kv if tables is not None else None)
                num_new_tokens += len(drafts)
            if (
                num_new_tokens <= 0
                or (check_held and self._is_in_flight(request))
                or (num_placeholders and self._placeholders_reach_end(request))
            ):
                continue
            if tables is not None:
                # ``allocate_slots``'s own first test, made here without the calls.
                num_slots = self._with_lookahead(request, num_new_tokens) if lookahead else num_new_tokens
                table = tables.get(request.request_id, ())
                if request.num_computed_tokens + num_slots > len(table) * block_size:
                    if not self._allocate_or_preempt(request, num_new_tokens):
                        return token_budget, True
                    preempted_this_step |= self._preempted_last
            scheduled[request.request_id] = num_new_tokens
            requests[request.request_id] = request
            token_budget -= num_new_tokens
            if drafts:
                output.spec_token_ids[request.request_id] = drafts
        return token_budget, preempted_this_step

    def _placeholders_reach_end(self, request: Request) -> bool:
        """Async: the samples in flight already include the request's last token."""
        num_placeholders = request.num_output_placeholders
        return num_placeholders > 0 and (
            len(request.output_token_ids) + num_placeholders >= request.max_tokens
            or len(request.all_token_ids) + num_placeholders >= self.config.max_model_len
        )

    def _advance_scheduled(self, output: SchedulerOutput, requests: dict[str, Request]) -> None:
        """Async: count the batch's tokens as computed now; a request that
        reaches its end samples a placeholder."""
        batch = {}
        for request_id, request in requests.items():
            num_computed = request.num_computed_tokens + output.num_scheduled_tokens[request_id]
            request.num_computed_tokens = num_computed
            # Whether every token, placeholders included, is now computed (every request, every step).
            samples = len(request.all_token_ids) + request.num_output_placeholders == num_computed
            if samples:
                request.num_output_placeholders += 1
            batch[request_id] = (num_computed, samples, request.num_preemptions)
        self._async_batches[id(output)] = batch

    def _is_in_flight(self, request: Request) -> bool:
        return any(requests.get(request.request_id) is request for _, requests in self._in_flight)

    def _held_by_batch(self, request: Request) -> bool:
        """Pipelining: a request in flight may be neither scheduled nor preempted."""
        return not self.config.async_scheduling and self._is_in_flight(request)

    def _batch_request_cap(self) -> int:
        """At most this many requests in the next batch (its share when pipelining)."""
        if self.config.max_concurrent_batches <= 1 or not self.config.even_batches_in_flight:
            return self.config.max_num_seqs
        num_free_slots = max(1, self.config.max_concurrent_batches - len(self._in_flight))
        num_schedulable = len(self.waiting) + sum(1 for r in self.running if not self._held_by_batch(r))
        return max(1, -(-num_schedulable // num_free_slots))

    def _schedule_waiting(
        self, output: SchedulerOutput, requests: dict[str, Request], token_budget: int, max_requests: int
    ) -> int:
        # Locals and no calls that cannot change the outcome: this runs per
        # request, and a batch of short pooling requests is hundreds of them.
        waiting, running, scheduled = self.waiting, self.running, output.num_scheduled_tokens
        max_num_seqs, uses_kv_cache = self.config.max_num_seqs, self.config.uses_kv_cache
        if not self.config.even_batches_in_flight:  # each batch in flight as large as a lone one
            max_num_seqs *= self.config.max_concurrent_batches
        adapters = self._running_adapters()
        skipped: list[Request] = []  # waiting for an adapter slot: back in line, in order, after the loop
        while waiting and token_budget > 0 and len(running) < max_num_seqs and len(scheduled) < max_requests:
            request = waiting.peek()
            if adapters is not None and not self._fits_adapters(request, adapters):
                skipped.append(waiting.pop())
                continue
            is_pooling = request.pooling_params is not None
            # A pooling request never reads the prefix cache (``get_computed_blocks``).
            computed_blocks, num_computed_tokens = ([], 0) if is_pooling else self.kv.get_computed_blocks(request)
            num_new_tokens = len(request.all_token_ids) - num_computed_tokens
            if not is_pooling and 0 < self.config.long_prefill_token_threshold < num_new_tokens:
                num_new_tokens = self.config.long_prefill_token_threshold  # the rest in later steps
            if num_new_tokens > token_budget and (is_pooling or not self.config.enable_chunked_prefill):
                break
            num_new_tokens = min(num_new_tokens, token_budget)
            if uses_kv_cache:
                num_slots = self._with_lookahead(request, num_new_tokens, num_computed_tokens)
                if self._allocate(request, num_slots, computed_blocks) is None:
                    break
            waiting.pop()
            request.num_computed_tokens = num_computed_tokens
            if request.num_preemptions == 0:
                request.num_cached_tokens = num_computed_tokens
            request.status = RequestStatus.RUNNING
            running.append(request)
            scheduled[request.request_id] = num_new_tokens
            requests[request.request_id] = request
            token_budget -= num_new_tokens
            if adapters is not None and request.lora_request is not None:
                adapters.add(request.lora_request.lora_int_id)
        for request in reversed(skipped):
            waiting.requeue(request)
        return token_budget

    def _running_adapters(self) -> set[int] | None:
        """The LoRA adapters of the running requests (None with LoRA off)."""
        if not self.config.max_loras:
            return None
        return {r.lora_request.lora_int_id for r in self.running if r.lora_request is not None}

    def _fits_adapters(self, request: Request, adapters: set[int]) -> bool:
        """Whether ``request`` may start: its adapter is running already or a slot is free."""
        lora = request.lora_request
        return lora is None or lora.lora_int_id in adapters or len(adapters) < self.config.max_loras

    # ----------------------------------------------------------------- update

    def update_from_output(
        self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> list[EngineCoreOutput]:
        """Advance computed tokens, append samples, stop and free requests."""
        pooling = self.finish_pooling_step(scheduler_output, runner_output)
        if pooling is not None:
            return [
                EngineCoreOutput(r.request_id, [], finish_reason=r.finish_reason, num_cached_tokens=r.num_cached_tokens, pooled=r.pooled)
                for r in pooling
            ]
        outputs = []
        batch_requests = self._retire_batch(scheduler_output)
        async_batch = self._async_batches.pop(id(scheduler_output), None)
        # Locals: this runs per scheduled request, every step.
        sampled, logprobs, prompt_logprobs = (
            runner_output.sampled_token_ids, runner_output.logprobs, runner_output.prompt_logprobs
        )
        spec_token_ids = scheduler_output.spec_token_ids
        uses_draft_model = self.drafts is not None and self.drafts.config.uses_draft_model
        draft_token_ids = runner_output.draft_token_ids if uses_draft_model else None
        cache_blocks, running_status, max_model_len = self.kv.cache_blocks, RequestStatus.RUNNING, self.config.max_model_len
        finished: list[Request] = []
        for request_id, num_tokens in scheduler_output.num_scheduled_tokens.items():
            request = batch_requests.get(request_id)
            if request is None or request.status is not running_status:
                continue  # finished or preempted meanwhile
            if async_batch is None:
                request.num_computed_tokens += num_tokens
                if spec_token_ids:
                    # Rejected drafts' KV is not the request's: computed again later.
                    request.num_computed_tokens -= self.drafts.num_rejected(
                        spec_token_ids.get(request_id), len(sampled.get(request_id, ()))
                    )
                num_computed = request.num_computed_tokens
            else:
                num_computed, samples, num_preemptions = async_batch[request_id]
                if num_preemptions != request.num_preemptions:
                    continue  # preempted (and resumed) since: its placeholder is gone
                request.num_output_placeholders -= int(samples)
            if request.pooling_params is not None:
                outputs.append(self._finish_pooling(request, runner_output.pooled.get(request_id)))
                continue
            cache_blocks(request, num_computed)
            new_token_ids = []
            for token_id in sampled.get(request_id, ()):
                request.append_output_token(token_id)
                new_token_ids.append(token_id)
                if check_stop(request, max_model_len):
                    break
            if draft_token_ids is not None:
                request.spec_token_ids = draft_token_ids.get(request_id, [])
            new_prompt_logprobs = prompt_logprobs.get(request_id) or []
            if new_prompt_logprobs:  # a prompt chunk's step: no drafts, so it began at num_computed - num_tokens
                new_prompt_logprobs = request.unsent_prompt_logprobs(num_computed - num_tokens, new_prompt_logprobs)
            if not new_token_ids and not new_prompt_logprobs:
                continue
            entries = logprobs.get(request_id)
            finish_reason = request.status.finish_reason
            outputs.append(
                EngineCoreOutput(
                    request_id, new_token_ids, entries[: len(new_token_ids)] if entries else [], new_prompt_logprobs,
                    finish_reason, request.stop_reason, request.num_cached_tokens,
                )
            )
            if finish_reason is not None:
                finished.append(request)
        if finished:
            self._remove_finished(finished)
        return outputs

    def _remove_finished(self, finished: list[Request]) -> None:
        """Take requests that finished this step out of ``running`` (one pass,
        not a ``list.remove`` each: that is quadratic when many finish) and free them."""
        done = {id(request) for request in finished}
        self.running[:] = [r for r in self.running if id(r) not in done]
        for request in finished:
            self._release(request)

    def _retire_batch(self, scheduler_output: SchedulerOutput) -> dict[str, Request]:
        """Take ``scheduler_output``'s batch out of flight; its requests by id."""
        for index, (output, requests) in enumerate(self._in_flight):
            if output is scheduler_output:
                del self._in_flight[index]
                return requests
        # Not scheduled here (or already retired): only requests still current count.
        return {r: req for r in scheduler_output.num_scheduled_tokens if (req := self.requests.get(RequestId(r)))}

    def _release(self, request: Request) -> None:
        if self.config.uses_kv_cache:  # else it holds no blocks (``_allocate``)
            self.kv.free(request)
        self.runner_view.forget(request.request_id)
        if self.drafts is not None:
            self.drafts.forget(request.request_id)
        del self.requests[request.request_id]

    # ------------------------------------------------------------------ state

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def get_stats(self) -> SchedulerStats:
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_cache_usage=self.kv.usage(),
            num_free_blocks=self.kv.num_free_blocks,
            num_preemptions=self.num_preemptions,
            prefix_cache=self.kv.prefix_cache_stats,
            running_lora_adapters=self._adapter_names(self.running),
            waiting_lora_adapters=self._adapter_names(self.waiting),
            spec_decoding=self.drafts.stats_snapshot() if self.drafts is not None else None,
        )

    def _adapter_names(self, requests) -> list[str]:
        if not self.config.max_loras:
            return []
        return sorted({r.lora_request.lora_name for r in requests if r.lora_request is not None})
