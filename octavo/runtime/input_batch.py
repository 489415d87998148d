"""Scheduler output + runner state -> the flat tensors of one step.

Requests are laid out in the scheduler's order. Request ``i`` computes its
tokens ``[num_computed_tokens, num_computed_tokens + n)``; it samples only
when that range reaches the end of its tokens (a partial prompt chunk samples
nothing), and it scores prompt positions when prompt logprobs were asked for.
Everything is computed with vectorised numpy into pinned staging buffers,
then copied to the device asynchronously.

A decode-only step may be padded to ``padded_num_reqs`` (a captured decode
graph's size): padding requests have one token, slot -1 (nothing is
written), a sequence length of 0 and position 0; their outputs are ignored.
Any step may instead be padded to ``padded_num_reqs`` requests and
``padded_num_tokens`` tokens (a prefill graph's shape): padding requests
have no tokens and no context, padding tokens belong to no request, have
slot -1 and position 0.

``prepare_static`` pads a step to a platform's ``StepShape``
(``octavo.platforms.step_shapes``) with the same conventions: padding
requests have no tokens and no context, padding tokens belong to no request
(slot -1, position 0), the block table has exactly the shape's width, and
the rows to sample are padded to the shape's requests with row 0 (never
sampled). Where the shape has no width, only tokens and sampled rows are
padded and the attention sees the step's real requests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from octavo.core.attention import AttentionBatch
from octavo.core.scheduler_output import SchedulerOutput
from octavo.platforms.step_shapes import StepShape
from octavo.runtime.input_buffers import InputBuffers
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
    num_tokens: int  # real tokens (the tensors may be padded beyond it)
    # Rows of the hidden states to sample from, and whose they are.
    logits_indices: torch.Tensor | None
    sample_request_ids: list[str]
    is_uniform_decode: bool
    prompt_logprob_spans: list[PromptLogprobSpan] = field(default_factory=list)
    # Speculative decoding: the draft tokens of the sampled requests that
    # carry some. Such a request has ``1 + len(drafts)`` logits rows in
    # order (one per draft, then the bonus row); every other request one.
    spec_drafts: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class HostStep:
    """A step's host-side layout, shared by ``prepare`` and ``prepare_static``."""

    order: list[str]  # request ids, in the scheduler's order
    states: list
    rows: np.ndarray  # each request's row in the block table
    token_rows: np.ndarray  # each token's request row
    positions: np.ndarray  # each token's position
    starts: np.ndarray  # each request's num_computed_tokens
    ends: np.ndarray  # ... plus its scheduled tokens
    query_start_loc: np.ndarray  # the staging buffer, filled to num_reqs + 1
    sample_mask: np.ndarray  # requests that sample this step
    max_query_len: int
    is_uniform_decode: bool
    # Speculative decoding: each request's number of draft tokens (None: no drafts this step).
    num_drafts: np.ndarray | None = None
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)

    @property
    def num_reqs(self) -> int:
        return len(self.order)


class InputPreparer:
    def __init__(
        self,
        states: RequestStates,
        buffers: InputBuffers,
        block_size: int,
        device: torch.device,
        create_event: Callable[[], Any] | None = None,
    ) -> None:
        self.states = states
        self.buffers = buffers
        self.block_size = block_size
        self.device = device
        # The platform's ``create_event`` (None where uploads need no waiting).
        self._create_event = create_event
        # Recorded after each step's uploads: the pinned staging buffers may
        # be rewritten only once the copies out of them have run.
        self._staging_event = None
        # With LoRA on, the runner's ``LoRASlots``: each token's adapter slot is uploaded with the step.
        self.lora = None

    def prepare(
        self, scheduler_output: SchedulerOutput, padded_num_reqs: int | None = None, padded_num_tokens: int | None = None
    ) -> PreparedBatch:
        step = self._host_step(scheduler_output)
        batch = self._assemble(
            step.rows, step.token_rows, step.positions, step.ends, step.max_query_len, padded_num_reqs, padded_num_tokens
        )
        logits_indices = step.query_start_loc[1 : step.num_reqs + 1][step.sample_mask] - 1
        if step.num_drafts is not None:
            logits_indices = _rows_with_drafts(logits_indices, step.num_drafts[step.sample_mask])
        batch.logits_indices = torch.from_numpy(logits_indices).to(self.device, non_blocking=True)
        self._finish(batch, step)
        return batch

    def prepare_static(self, scheduler_output: SchedulerOutput, shape: StepShape) -> PreparedBatch:
        """The step padded to ``shape`` (the module docstring says how)."""
        step = self._host_step(scheduler_output)
        batch = self._assemble_static(step, shape)
        logits_indices = np.zeros(shape.num_reqs, dtype=np.int64)
        sampled = step.query_start_loc[1 : step.num_reqs + 1][step.sample_mask] - 1
        logits_indices[: len(sampled)] = sampled
        batch.logits_indices = self.buffers.to_device(logits_indices)
        self._finish(batch, step)
        return batch

    def _host_step(self, scheduler_output: SchedulerOutput) -> HostStep:
        """Positions, token ids, query starts and which requests sample (host side)."""
        buffers = self.buffers
        order = list(scheduler_output.num_scheduled_tokens)
        states = [self.states[r] for r in order]
        num_reqs = len(order)
        num_scheduled = np.fromiter(scheduler_output.num_scheduled_tokens.values(), np.int64, num_reqs)
        starts = np.fromiter((s.num_computed_tokens for s in states), np.int64, num_reqs)
        rows = np.fromiter((s.row for s in states), np.int64, num_reqs)
        ends = starts + num_scheduled
        num_tokens = int(num_scheduled.sum())
        is_uniform_decode = num_tokens == num_reqs
        self.wait_for_staging()

        query_start_loc = buffers.query_start_loc.np
        query_start_loc[0] = 0
        np.cumsum(num_scheduled, out=query_start_loc[1 : num_reqs + 1])
        if is_uniform_decode:
            positions = starts
            token_rows = rows
            buffers.input_ids.np[:num_tokens] = [s.token_ids[p] for s, p in zip(states, positions.tolist())]
        else:
            token_request = np.repeat(np.arange(num_reqs), num_scheduled)
            positions = starts[token_request] + np.arange(num_tokens) - np.repeat(query_start_loc[:num_reqs], num_scheduled)
            token_rows = rows[token_request]
            # A request's drafts follow its known tokens (its slice ends at them).
            drafts = scheduler_output.spec_token_ids
            buffers.input_ids.np[:num_tokens] = np.concatenate(
                [
                    np.asarray(s.token_ids[b:e] + drafts[r] if r in drafts else s.token_ids[b:e], dtype=np.int64)
                    for r, s, b, e in zip(order, states, starts.tolist(), ends.tolist())
                ]
            )
        num_known = np.fromiter((len(s.token_ids) for s in states), np.int64, num_reqs)
        num_drafts = None
        if scheduler_output.spec_token_ids:
            spec = scheduler_output.spec_token_ids
            num_drafts = np.fromiter((len(spec.get(r, ())) for r in order), np.int64, num_reqs)
            num_known += num_drafts
        return HostStep(
            order, states, rows, token_rows, positions, starts, ends, query_start_loc, ends == num_known,
            int(num_scheduled.max()), is_uniform_decode, num_drafts, scheduler_output.spec_token_ids,
        )

    def _finish(self, batch: PreparedBatch, step: HostStep) -> None:
        batch.sample_request_ids = [r for r, sample in zip(step.order, step.sample_mask.tolist()) if sample]
        if step.spec_token_ids:
            spec = step.spec_token_ids
            batch.spec_drafts = {r: spec[r] for r in batch.sample_request_ids if r in spec}
        batch.is_uniform_decode = step.is_uniform_decode
        batch.prompt_logprob_spans = self._prompt_logprob_spans(step.states, step.starts, step.ends, step.query_start_loc)

    def prepare_decode_from_device(
        self, request_ids: list[str], positions: np.ndarray, token_ids: torch.Tensor, padded_num_reqs: int | None
    ) -> PreparedBatch:
        """A one-token step for each request at ``positions``, whose input tokens
        are still on the device (``token_ids``, one per request, in order): the
        step after one whose samples have not reached the host yet."""
        num_reqs = len(request_ids)
        rows = np.fromiter((self.states[r].row for r in request_ids), np.int64, num_reqs)
        self.wait_for_staging()
        self.buffers.query_start_loc.np[: num_reqs + 1] = np.arange(num_reqs + 1)
        batch = self._assemble(rows, rows, positions, positions + 1, 1, padded_num_reqs)
        batch.input_ids[:num_reqs].copy_(token_ids)  # device to device, in stream order
        batch.sample_request_ids = list(request_ids)
        batch.is_uniform_decode = True
        return batch

    def _assemble(
        self, rows, token_rows, positions, ends, max_query_len: int, padded_num_reqs: int | None,
        padded_num_tokens: int | None = None,
    ) -> PreparedBatch:
        """Fill positions, slots, lengths and block tables (host), then upload."""
        buffers, block_size = self.buffers, self.block_size
        num_reqs, num_tokens = len(rows), len(positions)
        self._fill_tokens(token_rows, positions, ends)
        total_reqs, total_tokens = num_reqs, num_tokens
        if padded_num_tokens is not None:
            total_reqs, total_tokens = padded_num_reqs, padded_num_tokens
            self._pad_tokens(num_reqs, num_tokens, total_reqs, total_tokens)
        elif padded_num_reqs is not None and padded_num_reqs > num_reqs:
            total_reqs = total_tokens = padded_num_reqs
            self._pad_decode(num_reqs, padded_num_reqs)
        self._upload_lora_slots(token_rows, total_tokens)
        # Only the columns the longest request uses are gathered and uploaded:
        # with a long max_model_len the full width would be megabytes a step.
        width = max(1, -(-int(ends.max()) // block_size))
        table = buffers.block_table.np[: num_reqs * width].reshape(num_reqs, width)
        table[:] = self.states.block_table[rows, :width]
        block_table = buffers.block_table.upload(num_reqs * width).view(num_reqs, width)
        if padded_num_reqs is not None:
            # Graphs read a table of fixed shape and address; columns past
            # ``width`` and rows of padding requests are never read.
            buffers.graph_block_table[:num_reqs, :width].copy_(block_table)
            block_table = buffers.graph_block_table[:total_reqs]
        attn_batch = AttentionBatch(
            query_start_loc=buffers.query_start_loc.upload(total_reqs + 1),
            seq_lens=buffers.seq_lens.upload(total_reqs),
            block_table=block_table,
            slot_mapping=buffers.slot_mapping.upload(total_tokens),
            num_reqs=num_reqs,
            num_actual_tokens=num_tokens,
            max_query_len=max_query_len,
            max_seq_len=int(ends.max()),
            query_start_loc_cpu=buffers.query_start_loc.host[: total_reqs + 1],
            seq_lens_cpu=buffers.seq_lens.host[:total_reqs],
        )
        return self._staged_batch(attn_batch, total_tokens, num_tokens)

    def _assemble_static(self, step: HostStep, shape: StepShape) -> PreparedBatch:
        """Fill and upload a step padded to ``shape``."""
        buffers, block_size = self.buffers, self.block_size
        num_reqs, num_tokens = step.num_reqs, len(step.positions)
        self._fill_tokens(step.token_rows, step.positions, step.ends)
        pad_requests = shape.block_table_width > 0
        total_reqs = shape.num_reqs if pad_requests else num_reqs
        self._pad_tokens(num_reqs, num_tokens, total_reqs, shape.num_tokens)
        self._upload_lora_slots(step.token_rows, shape.num_tokens)
        max_seq_len = int(step.ends.max())
        width = shape.block_table_width or max(1, -(-max_seq_len // block_size))
        table = buffers.block_table.np[: total_reqs * width].reshape(total_reqs, width)
        table[:num_reqs] = self.states.block_table[step.rows, :width]
        table[num_reqs:] = 0
        attn_batch = staged_attention_batch(
            buffers, total_reqs, width, shape.num_tokens, num_reqs, num_tokens,
            # Padded attention claims the shape's lengths, so that a backend's
            # internal shapes follow the bucket, not the data.
            max_query_len=shape.max_query_len if pad_requests else step.max_query_len,
            max_seq_len=width * block_size if pad_requests else max_seq_len,
        )
        return self._staged_batch(attn_batch, shape.num_tokens, num_tokens)

    def _upload_lora_slots(self, token_rows: np.ndarray, total_tokens: int) -> None:
        """Each token's LoRA slot (padding tokens: none), for every LoRA layer of the step."""
        if self.lora is not None:
            self.lora.inputs.set_token_slots(self.lora.token_slots(token_rows, total_tokens))

    def _staged_batch(self, attn_batch: AttentionBatch, total_tokens: int, num_tokens: int) -> PreparedBatch:
        """The step's token inputs uploaded from the staging buffers, around ``attn_batch``."""
        buffers = self.buffers
        batch = PreparedBatch(
            input_ids=buffers.input_ids.upload(total_tokens),
            positions=buffers.positions.upload(total_tokens),
            attn_batch=attn_batch,
            num_tokens=num_tokens,
            logits_indices=None,
            sample_request_ids=[],
            is_uniform_decode=True,
        )
        self._record_staging()
        return batch

    def _fill_tokens(self, token_rows, positions, ends) -> None:
        """Sequence lengths, positions and KV slots of the real requests and tokens (host)."""
        buffers, block_size = self.buffers, self.block_size
        buffers.seq_lens.np[: len(ends)] = ends
        buffers.positions.np[: len(positions)] = positions
        block_ids = self.states.block_table[token_rows, positions // block_size]
        buffers.slot_mapping.np[: len(positions)] = block_ids.astype(np.int64) * block_size + positions % block_size

    def wait_for_staging(self) -> None:
        """Before overwriting the pinned host buffers: the last uploads from them are done."""
        if self._staging_event is not None:
            self._staging_event.synchronize()

    def _record_staging(self) -> None:
        event = self._create_event() if self._create_event is not None else None
        if event is not None:
            event.record()
        self._staging_event = event

    def _pad_decode(self, num_reqs: int, padded: int) -> None:
        buffers = self.buffers
        buffers.query_start_loc.np[num_reqs + 1 : padded + 1] = np.arange(num_reqs + 1, padded + 1)
        buffers.seq_lens.np[num_reqs:padded] = 0
        buffers.input_ids.np[num_reqs:padded] = 0
        buffers.positions.np[num_reqs:padded] = 0
        buffers.slot_mapping.np[num_reqs:padded] = -1

    def _pad_tokens(self, num_reqs: int, num_tokens: int, total_reqs: int, total_tokens: int) -> None:
        buffers = self.buffers
        buffers.query_start_loc.np[num_reqs + 1 : total_reqs + 1] = num_tokens
        buffers.seq_lens.np[num_reqs:total_reqs] = 0
        buffers.input_ids.np[num_tokens:total_tokens] = 0
        buffers.positions.np[num_tokens:total_tokens] = 0
        buffers.slot_mapping.np[num_tokens:total_tokens] = -1

    @staticmethod
    def _prompt_logprob_spans(states, starts, ends, query_start_loc) -> list[PromptLogprobSpan]:
        spans = []
        for i, state in enumerate(states):
            if state.sampling_params.prompt_logprobs is None:
                continue
            start, end = int(starts[i]), int(ends[i])
            if start >= state.num_prompt_tokens - 1:
                continue
            last = min(end, state.num_prompt_tokens - 1)
            targets = state.prompt_token_ids[start + 1 : last + 1]
            spans.append(PromptLogprobSpan(state.request_id, int(query_start_loc[i]), targets))
        return spans


def staged_attention_batch(
    buffers: InputBuffers, total_reqs: int, width: int, total_tokens: int, num_reqs: int, num_tokens: int,
    max_query_len: int, max_seq_len: int,
) -> AttentionBatch:
    """Upload the filled staging buffers as an ``AttentionBatch`` of
    ``total_reqs`` requests (block table ``width`` columns wide) and
    ``total_tokens`` tokens, ``num_reqs`` / ``num_tokens`` of them real."""
    return AttentionBatch(
        query_start_loc=buffers.query_start_loc.upload(total_reqs + 1),
        seq_lens=buffers.seq_lens.upload(total_reqs),
        block_table=buffers.block_table.upload(total_reqs * width, (total_reqs, width)),
        slot_mapping=buffers.slot_mapping.upload(total_tokens),
        num_reqs=num_reqs,
        num_actual_tokens=num_tokens,
        max_query_len=max_query_len,
        max_seq_len=max_seq_len,
        query_start_loc_cpu=buffers.query_start_loc.host[: total_reqs + 1],
        seq_lens_cpu=buffers.seq_lens.host[:total_reqs],
    )


def _rows_with_drafts(last_rows: np.ndarray, num_drafts: np.ndarray) -> np.ndarray:
    """The logits rows of the sampled requests: each request's last
    ``1 + num_drafts`` token rows (its drafts' rows, then the bonus row)."""
    counts = num_drafts + 1
    firsts = np.repeat(last_rows - num_drafts, counts)
    offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    return firsts + offsets
