"""The scheduler's block allocation and preemption: a step's slots for a
request (its tokens plus the lookahead, never past its last possible token),
and, when the KV cache's blocks run out, which running request goes back to
the waiting queue to be recomputed (``request_queue.running_victim``: the
newest under ``fcfs``, the lowest priority under ``priority``). A request in
a pipelined batch in flight is never a victim: that batch still writes to its
blocks. ``Scheduler`` inherits these; they read its queues, configuration,
KV cache manager and runner view."""

from __future__ import annotations

from octavo.core.request import Request, RequestStatus
from octavo.core.request_queue import priority_key, running_victim


class BlockAllocation:
    def _allocate_or_preempt(self, request: Request, num_new_tokens: int) -> bool:
        """Allocate blocks, preempting newer requests; False if ``request`` itself went."""
        self._preempted_last = False
        while self._allocate(request, self._with_lookahead(request, num_new_tokens)) is None:
            # Never a request in flight: its batch still writes to its blocks.
            # ``request`` itself is not in flight, so a victim always exists.
            candidates = [r for r in self.running if not self._held_by_batch(r)]
            victim = running_victim(candidates, self.config.policy)
            self.running.remove(victim)
            self._preempt(victim)
            self._preempted_last = True
            if victim is request:
                return False
        return True

    def _allocate(self, request: Request, num_slots: int, computed_blocks=None):
        """``KVCacheManager.allocate_slots``, or nothing to allocate without a KV cache."""
        if not self.config.uses_kv_cache:
            return []
        return self.kv.allocate_slots(request, num_slots, computed_blocks)

    def _preempt_for_waiting_priority(self) -> None:
        """Preempt running requests of lower priority than the waiting head
        until it can start (a sequence slot and blocks for its first chunk)."""
        if not self.waiting:
            return
        head = self.waiting.peek()
        while not self._could_start(head):
            candidates = [r for r in self.running if not self._held_by_batch(r)]
            if not candidates:
                return
            victim = running_victim(candidates, "priority")
            if priority_key(victim) <= priority_key(head):
                return
            self.running.remove(victim)
            self._preempt(victim)

    def _could_start(self, request: Request) -> bool:
        if len(self.running) >= self.config.max_num_seqs:
            return False
        if not self.config.uses_kv_cache:
            return True
        num_tokens = min(request.num_tokens, self.config.max_num_batched_tokens)
        num_slots = self._with_lookahead(request, num_tokens, 0)
        return self.kv.num_free_blocks >= -(-num_slots // self.kv.block_size)

    def _with_lookahead(self, request: Request, num_new_tokens: int, num_computed_tokens: int | None = None) -> int:
        """Slots to allocate: the step's tokens plus the lookahead, never past
        the request's last possible token (so admission stays exact)."""
        if num_computed_tokens is None:
            num_computed_tokens = request.num_computed_tokens
        last = min(self.config.max_model_len, request.num_prompt_tokens + request.max_tokens)
        lookahead = min(self.config.num_lookahead_tokens, max(0, last - num_computed_tokens - num_new_tokens))
        return num_new_tokens + lookahead

    def _preempt(self, request: Request) -> None:
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_output_placeholders = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.requeue(request)
        self.runner_view.forget(request.request_id)
