"""The runner's copy of each request: token ids, block table, progress.

Filled from ``NewRequestData`` the first time a request is scheduled (or
after it was preempted), then kept up to date from ``CachedRequestData``
deltas. Dropped when the scheduler lists the id in ``finished_request_ids``.
"""

from __future__ import annotations

from dataclasses import dataclass

from octavo.core.sampling_params import SamplingParams
from octavo.core.scheduler_output import CachedRequestData, NewRequestData, SchedulerOutput


@dataclass
class RunnerRequestState:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # prompt + output so far
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]


class RequestStates(dict[str, RunnerRequestState]):
    def apply(self, scheduler_output: SchedulerOutput) -> None:
        for request_id in scheduler_output.finished_request_ids:
            self.pop(request_id, None)
        for new in scheduler_output.new_requests:
            self[new.request_id] = self._from_new(new)
        for cached in scheduler_output.cached_requests:
            self._update(self[cached.request_id], cached)

    @staticmethod
    def _from_new(new: NewRequestData) -> RunnerRequestState:
        return RunnerRequestState(
            request_id=new.request_id,
            prompt_token_ids=list(new.prompt_token_ids),
            token_ids=list(new.prompt_token_ids) + list(new.output_token_ids),
            sampling_params=new.sampling_params,
            block_ids=list(new.block_ids),
            num_computed_tokens=new.num_computed_tokens,
        )

    @staticmethod
    def _update(state: RunnerRequestState, cached: CachedRequestData) -> None:
        state.token_ids.extend(cached.new_token_ids)
        state.block_ids.extend(cached.new_block_ids)
        state.num_computed_tokens = cached.num_computed_tokens
