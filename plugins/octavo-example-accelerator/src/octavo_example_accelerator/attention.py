"""``example_paged``: an attention backend with its own KV-cache layout.

A backend owns its cache layout; this one keeps a slot's key and value side
by side, ``[num_blocks, block_size, 2, num_kv_heads, head_size]`` (the
reference uses ``[2, num_blocks, ...]``), and computes attention one request
at a time with an explicit softmax in float32. It is deliberately simple and
slow: its point is that the conformance suite, which compares it with the
torch reference, passes for an independent implementation.

It declines models with a sliding window (``supports`` says why), so the
platform falls back to ``torch_paged`` for those: a plugin may implement a
subset.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo.core.attention import AttentionBackend, AttentionBatch, AttentionSpec


@dataclass
class ExampleMetadata:
    slot_mapping: torch.Tensor  # [T]; negative: do not write
    query_start: list[int]  # host copies: this backend plans on the host
    seq_lens: list[int]
    block_table: torch.Tensor  # [num_reqs, max_blocks]
    num_actual_tokens: int


class ExamplePagedAttention(AttentionBackend):
    name = "example_paged"

    @classmethod
    def supports(cls, spec: AttentionSpec) -> str | None:
        if spec.sliding_window is not None:
            return "sliding windows are not implemented in example_paged"
        if spec.num_heads % spec.num_kv_heads:
            return f"num_heads ({spec.num_heads}) is not a multiple of num_kv_heads ({spec.num_kv_heads})"
        return None

    def kv_cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        spec = self.spec
        return (num_blocks, spec.block_size, 2, spec.num_kv_heads, spec.head_size)

    def build_metadata(self, batch: AttentionBatch) -> ExampleMetadata:
        query_start = batch.query_start_loc_cpu if batch.query_start_loc_cpu is not None else batch.query_start_loc
        seq_lens = batch.seq_lens_cpu if batch.seq_lens_cpu is not None else batch.seq_lens
        return ExampleMetadata(
            slot_mapping=batch.slot_mapping[: batch.num_actual_tokens],
            query_start=query_start[: batch.num_reqs + 1].tolist(),
            seq_lens=seq_lens[: batch.num_reqs].tolist(),
            block_table=batch.block_table[: batch.num_reqs].to(torch.long),
            num_actual_tokens=batch.num_actual_tokens,
        )

    def forward(self, query, key, value, kv_cache, metadata: ExampleMetadata) -> torch.Tensor:
        spec = self.spec
        slots = kv_cache.view(-1, 2, spec.num_kv_heads, spec.head_size)
        num_tokens = metadata.num_actual_tokens
        written = metadata.slot_mapping >= 0
        targets = metadata.slot_mapping[written]
        slots[targets, 0] = key[:num_tokens][written].to(slots.dtype)
        slots[targets, 1] = value[:num_tokens][written].to(slots.dtype)
        output = torch.zeros_like(query)
        for index, seq_len in enumerate(metadata.seq_lens):
            start, end = metadata.query_start[index], metadata.query_start[index + 1]
            if end > start:
                output[start:end] = self._attend(query[start:end], slots, metadata.block_table[index], seq_len)
        return output

    def _attend(self, query: torch.Tensor, slots: torch.Tensor, block_ids: torch.Tensor, seq_len: int) -> torch.Tensor:
        spec = self.spec
        positions = torch.arange(seq_len, device=query.device)
        context = slots[block_ids[positions // spec.block_size] * spec.block_size + positions % spec.block_size]
        keys, values = context[:, 0].float(), context[:, 1].float()  # [L, Hkv, D]
        group = spec.num_heads // spec.num_kv_heads
        keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", query.float(), keys) * spec.scale
        query_positions = positions[seq_len - query.shape[0] :]
        causal = positions[None, :] <= query_positions[:, None]  # [q, k]
        scores = scores.masked_fill(~causal[None], float("-inf"))
        return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), values).to(query.dtype)
