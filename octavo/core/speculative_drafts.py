"""The scheduler's side of speculative decoding: which request gets how many
drafts this step, and what came of them (``SpecDecodingStats``).

A running request that has caught up (one new token to compute) and may
speculate (``may_speculate``) gets drafts, scheduled after its next token in
the same step. N-gram drafts are proposed here; a draft model's come back
with each step's output (``ModelRunnerOutput.draft_token_ids``, kept on
``Request.spec_token_ids``). Its output holds the drafts the model accepted
and one token more; the rejected drafts are taken back off
``num_computed_tokens`` (their KV slots are simply written again later).
Drafts never run past ``max_tokens`` or ``max_model_len``, nor take more
than the step's budget or KV blocks that are not free."""

from __future__ import annotations

import copy

from octavo.core.kv_cache_manager import KVCacheManager
from octavo.core.ngram_proposer import NgramProposer
from octavo.core.request import Request
from octavo.core.scheduler_config import SpecDecodingStats
from octavo.core.speculative_config import SpeculativeConfig, may_speculate


class SpeculativeDrafts:
    def __init__(self, config: SpeculativeConfig, max_model_len: int) -> None:
        self.config = config
        self.max_model_len = max_model_len
        self.proposer = NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max, config.num_speculative_tokens)
        self.stats = SpecDecodingStats()

    def enabled_for(self, num_running: int) -> bool:
        """Whether this step drafts at all (``disable_by_batch_size``)."""
        limit = self.config.disable_by_batch_size
        return limit is None or num_running < limit

    def propose_for(self, request: Request, budget: int, kv: KVCacheManager | None = None) -> list[int]:
        """Drafts for a caught-up running ``request``: at most ``budget``,
        never past its last possible token (its next token is not a draft),
        none a grammar would refuse, and none at all unless their KV slots
        fit the free blocks of ``kv`` (drafts never make the scheduler
        preempt anyone)."""
        if budget < 1 or not may_speculate(request):
            return []
        # The step computes the next token plus the drafts; all must fit the request's end.
        room = min(request.max_tokens - len(request.output_token_ids), self.max_model_len - len(request.all_token_ids)) - 1
        if self.config.uses_draft_model:  # the workers proposed them with the last step's output
            drafts = request.spec_token_ids[: min(budget, room)]
        else:
            drafts = self.proposer.propose(request.request_id, request.all_token_ids, min(budget, room))
        if drafts and request.grammar is not None:
            drafts = request.grammar.valid_drafts(drafts)
        if drafts and kv is not None:
            num_slots = request.num_computed_tokens + 1 + len(drafts)
            if -(-num_slots // kv.block_size) - kv.num_request_blocks(request.request_id) > kv.num_free_blocks:
                return []
        return drafts

    def num_rejected(self, drafts: list[int] | None, num_sampled: int) -> int:
        """How many of ``drafts`` the runner rejected, given the tokens it
        returned (accepted drafts plus one); counted in the stats."""
        if not drafts:
            return 0
        num_accepted = min(max(num_sampled - 1, 0), len(drafts))
        self.stats.record(len(drafts), num_accepted)
        return len(drafts) - num_accepted

    def forget(self, request_id: str) -> None:
        self.proposer.forget(request_id)

    def stats_snapshot(self) -> SpecDecodingStats:
        return copy.deepcopy(self.stats)
