"""The runner's copy of each request: token ids, block table row, progress.

Filled from ``NewRequestData`` the first time a request is scheduled (or
after it was preempted), then kept up to date from ``CachedRequestData``
deltas; dropped when the scheduler lists the id in ``finished_request_ids``.
Each live request owns one row of ``block_table`` (a numpy array) so that a
step's block table and slot mapping are gathered with vectorised indexing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from octavo.core.pooling_params import PoolingParams
from octavo.core.sampling_params import SamplingParams
from octavo.core.scheduler_output import NewRequestData, SchedulerOutput


@dataclass
class RunnerRequestState:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # prompt + output so far
    sampling_params: SamplingParams
    num_blocks: int
    num_computed_tokens: int
    row: int
    pooling_params: PoolingParams | None = None
    token_type_ids: list[int] | None = None
    lora_int_id: int = 0  # the request's LoRA adapter; 0: none
    # The sampler's ``SamplingRow`` for this request, built on first use
    # (``ModelRunner.sampling_rows``); it shares ``token_ids``.
    sampling_row: Any = None
    # Greedy with no logprobs, prompt logprobs or logit edits (decode overlap's
    # test, made for every request every step; the params never change).
    plain_greedy: bool = field(init=False)

    def __post_init__(self) -> None:
        params = self.sampling_params
        self.plain_greedy = (
            params.is_greedy
            and params.logprobs is None
            and params.prompt_logprobs is None
            and not params.edits_logits
        )

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]


class RequestStates(dict[str, RunnerRequestState]):
    def __init__(self, max_num_reqs: int = 256, max_blocks_per_req: int = 1024) -> None:
        super().__init__()
        self.block_table = np.zeros((max_num_reqs, max_blocks_per_req), dtype=np.int32)
        self._free_rows = list(range(max_num_reqs - 1, -1, -1))

    def apply(self, scheduler_output: SchedulerOutput) -> None:
        for request_id in scheduler_output.finished_request_ids:
            state = self.pop(request_id, None)
            if state is not None:
                self._free_rows.append(state.row)
        for new in scheduler_output.new_requests:
            self[new.request_id] = self._from_new(new)
        # Inline, with no call per request: this runs for every request of every decode step.
        cached = scheduler_output.cached_requests
        for request_id, new_token_ids, new_block_ids, num_computed_tokens in zip(
            cached.request_ids, cached.new_token_ids, cached.new_block_ids, cached.num_computed_tokens
        ):
            state = self[request_id]
            if new_token_ids:
                state.token_ids.extend(new_token_ids)
            if new_block_ids:
                self._set_blocks(state, new_block_ids)
            state.num_computed_tokens = num_computed_tokens

    def block_ids(self, request_id: str) -> list[int]:
        state = self[request_id]
        return self.block_table[state.row, : state.num_blocks].tolist()

    def _set_blocks(self, state: RunnerRequestState, block_ids: list[int]) -> None:
        end = state.num_blocks + len(block_ids)
        if end > self.block_table.shape[1]:
            raise ValueError(f"request {state.request_id} needs {end} blocks, more than max_model_len allows")
        self.block_table[state.row, state.num_blocks : end] = block_ids
        state.num_blocks = end

    def _from_new(self, new: NewRequestData) -> RunnerRequestState:
        if not self._free_rows:
            raise RuntimeError("more live requests than max_num_seqs")
        prompt_token_ids = list(new.prompt_token_ids)
        state = RunnerRequestState(
            request_id=new.request_id,
            prompt_token_ids=prompt_token_ids,
            token_ids=prompt_token_ids + list(new.output_token_ids),
            sampling_params=new.sampling_params,
            num_blocks=0,
            num_computed_tokens=new.num_computed_tokens,
            row=self._free_rows.pop(),
            pooling_params=new.pooling_params,
            token_type_ids=new.token_type_ids,
            lora_int_id=new.lora_request.lora_int_id if new.lora_request is not None else 0,
        )
        if new.block_ids:  # none for an encoder's pooling request: no numpy call for nothing
            self._set_blocks(state, new.block_ids)
        return state
