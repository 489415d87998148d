"""Many pooling inputs added to a data-parallel engine at once (issue 21):
what ``LLMEngine.add_pooling_requests`` is to one engine, for the front of
the replicas (``DataParallelEngine.add_pooling_requests``). The inputs are
checked together as one engine checks them (``check_pooling_batch``, then
whether a step holds the longest), all go to the least-loaded replica in
one message (``["add_pooling", ids, texts, token ids, segment ids,
params]``; a pooling input reads no prefix cache, so no replica holds
anything it could reuse), and the front records each for its output.
Through ``add_request`` each input paid for its own tokenizing, admission
check, block hashes, routing and message."""

from __future__ import annotations

from typing import TYPE_CHECKING

from octavo.core.pooling_batch import PoolingBatch, check_pooling_batch
from octavo.core.pooling_params import PoolingParams
from octavo.core.scheduler_config import check_pooling_lengths

if TYPE_CHECKING:
    from octavo.distributed.data_parallel import DataParallelEngine


def add_pooling_batch(engine: DataParallelEngine, batch: PoolingBatch, params: PoolingParams) -> None:
    """Check ``batch`` (all or none), send it to one replica, record it at the front."""
    front = engine._front
    check_pooling_batch(engine, batch, params, front.live_requests)
    check_pooling_lengths(batch.token_ids, engine.scheduler_config)
    if not batch.request_ids:
        return
    router = engine.router
    decision = router.choose([])  # the least-loaded replica
    message = ["add_pooling", batch.request_ids, batch.texts, batch.token_ids, batch.token_type_ids, params]
    engine._send(engine._replicas[decision.replica], message)
    for request_id, token_ids in zip(batch.request_ids, batch.token_ids):
        router.add(request_id, decision, [], router.cost(len(token_ids), 0))
    front.add_pooling_batch(batch.request_ids, batch.texts, batch.token_ids)
