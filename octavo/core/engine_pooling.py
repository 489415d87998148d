"""The engine's side of pooling inputs (embeddings, classification, scores):
queued one at a time or as a batch for the scheduler, or, while the engine
holds nothing else, stepped straight through the executor
(``pooling_lane``). ``LLMEngine`` inherits these; they read its scheduler,
output processor, limits and request ids."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from octavo.core.outputs import PoolingRequestOutput
from octavo.core.pooling_batch import POOLING_SAMPLING_PARAMS, PoolingBatch, check_pooling_batch, pooling_requests
from octavo.core.pooling_lane import PoolingLane, lane_setting
from octavo.core.pooling_params import PoolingParams
from octavo.core.request import Request
from octavo.core.types import RequestId


class EnginePooling:
    def _add_pooling_request(
        self, request_id: str, prompt_text: str | None, prompt_token_ids: list[int], params: PoolingParams,
        token_type_ids: list[int] | None,
    ) -> str:
        request = Request(
            request_id=RequestId(request_id),
            prompt_token_ids=prompt_token_ids,
            sampling_params=POOLING_SAMPLING_PARAMS,
            max_tokens=0,
            block_size=self.limits.block_size,
            pooling_params=params,
            token_type_ids=list(token_type_ids) if token_type_ids is not None else None,
        )
        self.scheduler.add_request(request)
        self.output_processor.add_pooling_request(request_id, prompt_text, prompt_token_ids)
        self._parent_children[request_id] = [request_id]
        return request_id

    def add_pooling_requests(self, batch: PoolingBatch, params: PoolingParams) -> None:
        """``add_request`` for many pooling inputs that share ``params``, at a
        fraction of its cost per input (``pooling_batch``); all are checked
        before any is queued."""
        if self._dead is not None:
            raise self._dead
        check_pooling_batch(self, batch, params, self._parent_children)
        self.scheduler.add_pooling_requests(pooling_requests(batch, params, self.limits.block_size))
        self.output_processor.add_pooling_requests(batch.request_ids, batch.texts, batch.token_ids)
        self._parent_children.update((request_id, [request_id]) for request_id in batch.request_ids)

    def pools_directly(self) -> bool:
        """Whether a pooling call may step through ``PoolingLane`` now: an
        encoder's (no KV cache), the engine otherwise idle, no async scheduling."""
        return (
            self._dead is None and not self.scheduler.config.uses_kv_cache and not self.async_scheduling
            and not self._batches_in_flight and not self.has_unfinished_requests() and lane_setting()
        )

    def pool_batches(
        self, batches: Iterable[PoolingBatch], params: PoolingParams, on_outputs: Callable[[int], None] | None = None
    ) -> list[PoolingRequestOutput]:
        """The outputs of pooling ``batches`` (checked as ``add_pooling_requests``
        checks them) through ``PoolingLane``; only when ``pools_directly()``."""
        if self._dead is not None:
            raise self._dead
        return PoolingLane(self).run(batches, params, on_outputs)
