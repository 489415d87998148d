"""The scheduler's side of pooling requests (embeddings, classification,
scores): they are admitted as a batch and all end with the step that
computes them, so both are done in one pass over the batch rather than per
request (a batch is hundreds of short inputs). ``Scheduler`` inherits these;
they read its queues, KV cache manager and runner view."""

from __future__ import annotations

from octavo.core.request import Request, RequestStatus
from octavo.core.scheduler_config import check_admissible
from octavo.core.scheduler_output import EngineCoreOutput, ModelRunnerOutput, PoolingResult, SchedulerOutput
from octavo.errors import RequestTooLargeError


class PoolingSteps:
    def add_pooling_requests(self, requests: list[Request]) -> None:
        """``add_request`` for a batch of pooling requests. Their admission
        depends on their length alone, so the longest decides for all unless
        it fails; then the first that fails raises, as one by one."""
        if not requests:
            return
        config, num_blocks, block_size = self.config, self.kv.num_blocks, self.kv.block_size
        try:
            check_admissible(max(requests, key=lambda r: len(r.prompt_token_ids)), config, num_blocks, block_size)
        except RequestTooLargeError:
            for request in requests:
                check_admissible(request, config, num_blocks, block_size)
        request_ids = {r.request_id for r in requests}
        if len(request_ids) != len(requests) or not self.requests.keys().isdisjoint(request_ids):
            seen = set(self.requests)
            for request in requests:
                if request.request_id in seen:
                    raise ValueError(f"duplicate request id {request.request_id!r}")
                seen.add(request.request_id)
        self.requests.update((r.request_id, r) for r in requests)
        for request in requests:
            self.waiting.add(request)

    def finish_pooling_step(
        self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> list[PoolingResult] | None:
        """``update_from_output`` for a step of pooling requests, which all end
        with it: ``_finish_pooling`` for each in one pass, the running list
        rebuilt once instead of searched per request (a batch is hundreds of
        short inputs). None where the step is not one (async, or it sampled)."""
        pooled = runner_output.pooled
        if not pooled or runner_output.sampled_token_ids or id(scheduler_output) in self._async_batches:
            return None
        batch_requests = self._retire_batch(scheduler_output)
        results = []
        uses_kv_cache, requests = self.config.uses_kv_cache, self.requests
        view = self.runner_view
        sent_to_runner, sent_blocks, drop_from_runner = view.sent_tokens, view.sent_blocks, view.dropped
        for request_id, num_tokens in scheduler_output.num_scheduled_tokens.items():
            request = batch_requests.get(request_id)
            if request is None or request.status != RequestStatus.RUNNING:
                continue  # finished meanwhile
            request.num_computed_tokens += num_tokens
            vector = pooled.get(request_id)
            request.status = RequestStatus.FINISHED_STOPPED if vector is not None else RequestStatus.FINISHED_ERROR
            if uses_kv_cache:
                self.kv.free(request)
            if sent_to_runner.pop(request_id, None) is not None:  # ``_release``, inline: this runs per input
                drop_from_runner.add(request_id)
            sent_blocks.pop(request_id, None)
            del requests[request_id]
            results.append(PoolingResult(request_id, vector, request.num_cached_tokens))
        if results:  # a finished request has left ``requests``; those still running have not
            self.running[:] = [r for r in self.running if r.request_id in requests]
        return results

    def _finish_pooling(self, request: Request, pooled: bytes | None) -> EngineCoreOutput:
        """A pooling request ends with its step: with its vector, or as an error
        if the runner produced none (so that it can never wait forever)."""
        request.status = RequestStatus.FINISHED_STOPPED if pooled is not None else RequestStatus.FINISHED_ERROR
        self.running.remove(request)
        self._release(request)
        return EngineCoreOutput(
            request_id=request.request_id,
            new_token_ids=[],
            finish_reason=request.status.finish_reason,
            num_cached_tokens=request.num_cached_tokens,
            pooled=pooled,
        )
