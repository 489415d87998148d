"""What the model runner holds, as the scheduler tracks it: which requests it
keeps state for, how many of their tokens and KV blocks it has been sent,
and which it must drop at the next step.

Each scheduled request goes to the runner either whole (``NewRequestData``:
first scheduled, resumed after preemption, or a pooling request scheduled
again after its step raised: an encoder's runner keeps nothing between
steps) or as a delta (``CachedRequestData``'s columns: the tokens and blocks
it has not seen, and its computed count). With async scheduling the runner
already holds every token it sampled, so deltas carry no token ids.
"""

from __future__ import annotations

from octavo.core.request import Request
from octavo.core.scheduler_config import SchedulerConfig
from octavo.core.scheduler_output import NewRequestData, SchedulerOutput
from octavo.core.types import RequestId


class RunnerView:
    def __init__(self, kv_cache_manager, config: SchedulerConfig) -> None:
        self.kv = kv_cache_manager
        # The scheduler's own config, read live: the engine sets
        # ``async_scheduling`` on it once it knows its executor.
        self.config = config
        # Public: the scheduler's per-input pooling finish updates them inline.
        self.sent_tokens: dict[RequestId, int] = {}
        self.sent_blocks: dict[RequestId, int] = {}
        self.dropped: set[str] = set()

    def describe(self, output: SchedulerOutput, requests: dict[str, Request]) -> None:
        """Fill ``output``'s new and cached request data for the scheduled ``requests``."""
        if not output.num_scheduled_tokens:
            # The engine never sends an empty output: keep the drops for the next one.
            return
        output.finished_request_ids = self.dropped
        self.dropped = set()
        # Locals: this runs per scheduled request (RequestId is the str itself).
        sent_tokens, sent_blocks, new_requests = self.sent_tokens, self.sent_blocks, output.new_requests
        cached = output.cached_requests
        cached_ids, cached_tokens, cached_blocks, cached_computed = (
            cached.request_ids, cached.new_token_ids, cached.new_block_ids, cached.num_computed_tokens
        )
        tables = self.kv.req_to_blocks if self.config.uses_kv_cache else {}
        async_scheduling = self.config.async_scheduling
        for request_id, request in requests.items():
            num_sent = sent_tokens.get(request_id)
            if num_sent is not None and request.pooling_params is not None:
                # Scheduled again (its step raised): describe it whole.
                output.finished_request_ids.add(request_id)
                num_sent = None
            if num_sent is None:
                new_requests.append(self._new_request_data(request))
            else:
                table = tables.get(request_id, ())
                num_blocks_sent = sent_blocks[request_id]
                cached_ids.append(request_id)
                cached_tokens.append([] if async_scheduling else request.all_token_ids[num_sent:])
                cached_blocks.append([b.block_id for b in table[num_blocks_sent:]] if len(table) > num_blocks_sent else [])
                cached_computed.append(request.num_computed_tokens)
                sent_blocks[request_id] = len(table)
            sent_tokens[request_id] = len(request.all_token_ids)

    def forget(self, request_id: RequestId) -> None:
        """The request left the schedule (finished, aborted, preempted): the
        runner drops its state at the next step, if it held any."""
        if self.sent_tokens.pop(request_id, None) is not None:
            self.dropped.add(request_id)
        self.sent_blocks.pop(request_id, None)

    def _new_request_data(self, request: Request) -> NewRequestData:
        """A request the runner does not hold (first scheduled, or resumed)."""
        block_ids = self.kv.block_ids(request.request_id) if self.config.uses_kv_cache else []
        self.sent_blocks[request.request_id] = len(block_ids)
        return NewRequestData(
            request_id=request.request_id,
            # A pooling request's ids never change: the runner may read them as they are.
            prompt_token_ids=request.prompt_token_ids if request.pooling_params else list(request.prompt_token_ids),
            output_token_ids=list(request.output_token_ids),
            sampling_params=request.sampling_params,
            block_ids=block_ids,
            num_computed_tokens=request.num_computed_tokens,
            pooling_params=request.pooling_params,
            token_type_ids=request.token_type_ids,
            lora_request=request.lora_request,
            # Images whose span is still to compute (past ones were cached or computed).
            image_features=[f for f in request.image_features if f.end > request.num_computed_tokens] or None,
        )
