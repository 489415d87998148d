"""Paged attention with static shapes: the torch reference, made XLA-friendly.

XLA (TPU) compiles one program per distinct set of tensor shapes and stalls
whenever the host reads a device value. This backend computes exactly what
``torch_paged`` computes, with two differences:

* Every internal shape comes from a padded bucket: the number of requests
  (the rows of ``query_start_loc``), the longest query and the longest
  context are rounded up to powers of two (the context to a multiple of the
  block size), so a server settles on a handful of compiled programs. Buckets
  come from tensor shapes and the host-side ints ``max_query_len`` /
  ``max_seq_len``; no device value is ever read, and no other host int
  reaches the computation (XLA would bake it into the program). A runner
  that pads steps to a platform's ``StepShape`` passes tensors already padded
  and those two ints at the bucket, so these buckets change nothing.
* No data-dependent shape: padding tokens (negative slot, or past
  the requests' last query token) are not filtered out. Their KV write is redirected
  to the slot of the step's first real token, carrying that token's values,
  so the duplicate index writes identical data whatever order the scatter
  runs in; when the step has no real token at all, slot 0 is rewritten with
  its own contents. Outputs are gathered back to token order by index
  instead of by boolean mask; padding tokens get zeros.

It runs on any device; on the CPU it is tested against ``torch_paged``
(tests/platforms/test_static_paged.py), including on the ``meta`` device,
where any host read or data-dependent shape would raise.

KV cache layout: the same as ``torch_paged``, ``[2, num_blocks, block_size,
num_kv_heads, head_size]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from octavo.core.attention import AttentionBackend, AttentionBatch, AttentionSpec
from octavo.runtime.attention.torch_paged import TorchPagedAttention, TorchPagedMetadata, attend_padded


def bucket(n: int, multiple: int = 1) -> int:
    """The smallest power of two >= ``n``, rounded up to a multiple of ``multiple``."""
    size = 1 << max(n - 1, 0).bit_length()
    return -(-size // multiple) * multiple


@dataclass
class StaticPagedMetadata:
    padded: TorchPagedMetadata  # per-request views, padded to the buckets
    write_slots: torch.Tensor  # [T] slot each token's KV write goes to
    write_sources: torch.Tensor  # [T] token whose KV is written there
    any_write: torch.Tensor  # [] bool: the step has at least one real token
    token_rows: torch.Tensor  # [T] row of the flat [B * max_q] output for each token
    token_valid: torch.Tensor  # [T] False for padding tokens


def _pad_rows(tensor: torch.Tensor, num_rows: int, fill_last: bool) -> torch.Tensor:
    missing = num_rows - tensor.shape[0]
    if missing <= 0:
        return tensor
    rest = tensor.shape[1:]
    filler = tensor[-1:].expand(missing, *rest) if fill_last else tensor.new_zeros(missing, *rest)
    return torch.cat([tensor, filler])


def _padded_requests(batch: AttentionBatch, block_size: int) -> tuple[TorchPagedMetadata, torch.Tensor, int]:
    # Requests past ``num_reqs`` (padding) have no tokens and no context.
    num_given = batch.query_start_loc.shape[0] - 1
    num_reqs = bucket(num_given)
    max_query = bucket(max(batch.max_query_len, 1))
    max_context = bucket(max(batch.max_seq_len, 1), block_size)
    device = batch.block_table.device
    query_start = _pad_rows(batch.query_start_loc.to(torch.long), num_reqs + 1, fill_last=True)
    seq_lens = _pad_rows(batch.seq_lens.to(torch.long), num_reqs, fill_last=False)
    query_lens = query_start[1:] - query_start[:-1]
    offsets = torch.arange(max_query, device=device)
    query_valid = offsets[None, :] < query_lens[:, None]
    query_index = torch.where(query_valid, query_start[:-1, None] + offsets[None, :], 0)
    query_pos = (seq_lens - query_lens)[:, None] + offsets[None, :]

    num_cols = max_context // block_size
    block_table = batch.block_table[:num_given, :num_cols].to(torch.long)
    block_table = _pad_rows(F.pad(block_table, (0, num_cols - block_table.shape[1])), num_reqs, fill_last=False)
    positions = torch.arange(max_context, device=device)
    key_valid = positions[None, :] < seq_lens[:, None]
    key_slots = torch.where(key_valid, block_table[:, positions // block_size] * block_size + positions % block_size, 0)
    padded = TorchPagedMetadata(
        slot_mapping=batch.slot_mapping,
        query_index=query_index,
        query_valid=query_valid,
        query_pos=query_pos,
        key_slots=key_slots,
        key_valid=key_valid,
        num_actual_tokens=batch.num_actual_tokens,
    )
    return padded, query_start, max_query


def build_static_paged_metadata(batch: AttentionBatch, block_size: int) -> StaticPagedMetadata:
    padded, query_start, max_query = _padded_requests(batch, block_size)
    slots = batch.slot_mapping.to(torch.long)
    tokens = torch.arange(slots.shape[0], device=slots.device)
    # Real tokens are those of some request: before the last query end.
    token_valid = tokens < query_start[-1]
    writes = (slots >= 0) & token_valid
    any_write = writes.any()
    first_write = torch.argmax(writes.to(torch.int32))
    write_sources = torch.where(writes, tokens, first_write)
    write_slots = torch.where(any_write, slots[write_sources], 0)
    # Request of each token: how many requests end at or before it.
    request = (tokens[:, None] >= query_start[None, 1:]).sum(dim=1).clamp(max=query_start.shape[0] - 2)
    token_rows = request * max_query + (tokens - query_start[request]).clamp(min=0, max=max_query - 1)
    return StaticPagedMetadata(padded, write_slots, write_sources, any_write, token_rows, token_valid)


def write_kv_cache_static(
    key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, meta: StaticPagedMetadata
) -> None:
    num_kv_heads, head_size = key.shape[1], key.shape[2]
    for cache, new in ((kv_cache[0], key), (kv_cache[1], value)):
        flat = cache.view(-1, num_kv_heads, head_size)
        updates = torch.where(meta.any_write, new[meta.write_sources].to(flat.dtype), flat[meta.write_slots])
        flat.index_copy_(0, meta.write_slots, updates)


def static_paged_attention(
    query: torch.Tensor, kv_cache: torch.Tensor, meta: StaticPagedMetadata, spec: AttentionSpec
) -> torch.Tensor:
    padded = meta.padded
    mask = padded.mask(spec.sliding_window)
    out = attend_padded(query, kv_cache, padded.query_index, padded.key_slots, mask, spec)
    flat = out.reshape(-1, spec.num_heads, spec.head_size)  # [B * max_q, H, D]
    return torch.where(meta.token_valid[:, None, None], flat[meta.token_rows], 0).to(query.dtype)


class StaticPagedAttention(AttentionBackend):
    name = "static_paged"
    supports_logits_soft_cap = True

    @classmethod
    def supports(cls, spec: AttentionSpec) -> str | None:
        return TorchPagedAttention.supports(spec)

    def kv_cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        spec = self.spec
        return (2, num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size)

    def build_metadata(self, batch: AttentionBatch) -> StaticPagedMetadata:
        return build_static_paged_metadata(batch, self.spec.block_size)

    def forward(self, query, key, value, kv_cache, metadata: StaticPagedMetadata) -> torch.Tensor:
        write_kv_cache_static(key, value, kv_cache, metadata)
        return static_paged_attention(query, kv_cache, metadata, self.spec)
