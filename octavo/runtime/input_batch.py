"""Scheduler output + runner state -> the flat tensors of one step.

Requests are laid out in the scheduler's order. For each one the step
computes tokens ``[num_computed_tokens, num_computed_tokens + n)``; it samples
only when that range reaches the end of its tokens (a partial prompt chunk
samples nothing), and it scores prompt positions when prompt logprobs were
asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from octavo.core.attention import AttentionBatch
from octavo.core.scheduler_output import SchedulerOutput
from octavo.runtime.request_state import RequestStates


@dataclass
class PromptLogprobSpan:
    request_id: str
    hidden_start: int  # row of the first scored position in the hidden states
    target_token_ids: list[int]  # the prompt token each scored position predicts


@dataclass
class PreparedBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    attn_batch: AttentionBatch
    # Rows of the hidden states to sample from, and whose they are.
    logits_indices: torch.Tensor
    sample_request_ids: list[str]
    prompt_logprob_spans: list[PromptLogprobSpan] = field(default_factory=list)


def prepare_batch(
    states: RequestStates, scheduler_output: SchedulerOutput, block_size: int, device: torch.device
) -> PreparedBatch:
    num_reqs = len(scheduler_output.num_scheduled_tokens)
    num_tokens = scheduler_output.total_num_scheduled_tokens
    input_ids = np.empty(num_tokens, dtype=np.int64)
    positions = np.empty(num_tokens, dtype=np.int64)
    slot_mapping = np.empty(num_tokens, dtype=np.int64)
    query_start_loc = np.zeros(num_reqs + 1, dtype=np.int32)
    seq_lens = np.empty(num_reqs, dtype=np.int32)
    max_blocks = max(len(states[r].block_ids) for r in scheduler_output.num_scheduled_tokens)
    block_table = np.zeros((num_reqs, max(max_blocks, 1)), dtype=np.int32)
    logits_indices: list[int] = []
    sample_request_ids: list[str] = []
    spans: list[PromptLogprobSpan] = []

    offset = 0
    for i, (request_id, num_new) in enumerate(scheduler_output.num_scheduled_tokens.items()):
        state = states[request_id]
        start = state.num_computed_tokens
        end = start + num_new
        token_positions = np.arange(start, end)
        blocks = np.asarray(state.block_ids, dtype=np.int64)
        input_ids[offset : offset + num_new] = state.token_ids[start:end]
        positions[offset : offset + num_new] = token_positions
        slot_mapping[offset : offset + num_new] = blocks[token_positions // block_size] * block_size + token_positions % block_size
        block_table[i, : len(blocks)] = blocks
        seq_lens[i] = end
        query_start_loc[i + 1] = offset + num_new
        if end == len(state.token_ids):
            logits_indices.append(offset + num_new - 1)
            sample_request_ids.append(request_id)
        if state.sampling_params.prompt_logprobs is not None and start < state.num_prompt_tokens - 1:
            last = min(end, state.num_prompt_tokens - 1)
            spans.append(PromptLogprobSpan(request_id, offset, state.prompt_token_ids[start + 1 : last + 1]))
        offset += num_new

    def to_device(array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(device, non_blocking=True)

    query_start_loc_t = torch.from_numpy(query_start_loc)
    seq_lens_t = torch.from_numpy(seq_lens)
    attn_batch = AttentionBatch(
        query_start_loc=query_start_loc_t.to(device),
        seq_lens=seq_lens_t.to(device),
        block_table=to_device(block_table),
        slot_mapping=to_device(slot_mapping),
        num_reqs=num_reqs,
        num_actual_tokens=num_tokens,
        max_query_len=int(np.diff(query_start_loc).max()) if num_reqs else 0,
        max_seq_len=int(seq_lens.max()) if num_reqs else 0,
        query_start_loc_cpu=query_start_loc_t,
        seq_lens_cpu=seq_lens_t,
    )
    return PreparedBatch(
        input_ids=to_device(input_ids),
        positions=to_device(positions),
        attn_batch=attn_batch,
        logits_indices=torch.tensor(logits_indices, dtype=torch.long, device=device),
        sample_request_ids=sample_request_ids,
        prompt_logprob_spans=spans,
    )
