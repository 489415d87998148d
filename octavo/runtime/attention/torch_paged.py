"""Paged attention in plain torch: the reference backend, used on the CPU.

Each step the metadata gathers, for every request, the cache slots of its
whole context and builds one boolean mask (causal, context length, padding);
``forward`` then writes the new keys and values and runs one masked
``scaled_dot_product_attention`` over the padded batch (with logit
soft-capping or attention sinks, the same math spelled out: scores,
``cap * tanh(s / cap)``, mask, a sink column, softmax in float32, as
Hugging Face's eager attention does; ``torch_math.py``). Simple and exact, not
fast: every other backend is tested against this one. Decode steps (one
token per request) take a shorter road to the same math
(``torch_decode.py``): whole-block gathers, grouped heads by reshape, no
mask unless contexts differ.

KV cache layout (shared with the Triton backend): ``[2, num_blocks,
block_size, num_kv_heads, head_size]``. An fp8 cache with per-layer scales
(``set_kv_scales``) stores ``key * (1 / k_scale)`` rounded to fp8 and reads
``key * k_scale`` (folded into the softmax scale; ``v_scale`` multiplies
the output), as the Triton kernels do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from octavo.core.attention import AttentionBackend, AttentionBatch, AttentionSpec
from octavo.runtime.attention.torch_decode import DecodeView, attend_decode, build_decode_view
from octavo.runtime.attention.torch_math import masked_attention


@dataclass
class TorchPagedMetadata:
    slot_mapping: torch.Tensor  # [T]
    query_index: torch.Tensor  # [B, max_q] flat token index (0 for padding)
    query_valid: torch.Tensor  # [B, max_q]
    query_pos: torch.Tensor  # [B, max_q] position within the sequence
    key_slots: torch.Tensor  # [B, max_s] cache slot of each context position
    key_valid: torch.Tensor  # [B, max_s]
    num_actual_tokens: int
    decode: DecodeView | None = None  # set when every request computes one token
    _masks: dict[int | None, torch.Tensor] = field(default_factory=dict)

    def mask(self, sliding_window: int | None) -> torch.Tensor:
        """[B, 1, max_q, max_s] True where a query may attend to a key."""
        cached = self._masks.get(sliding_window)
        if cached is not None:
            return cached
        key_pos = torch.arange(self.key_slots.shape[1], device=self.key_slots.device)
        allowed = (key_pos[None, None, :] <= self.query_pos[:, :, None]) & self.key_valid[:, None, :]
        if sliding_window is not None:
            allowed &= key_pos[None, None, :] > self.query_pos[:, :, None] - sliding_window
        # Padding query rows attend to key 0 so that softmax stays finite;
        # their outputs are discarded.
        padding_rows = ~self.query_valid[:, :, None] & (key_pos == 0)[None, None, :]
        allowed = (allowed | padding_rows)[:, None]
        self._masks[sliding_window] = allowed
        return allowed


def build_torch_paged_metadata(batch: AttentionBatch, block_size: int) -> TorchPagedMetadata:
    device = batch.block_table.device
    query_start = batch.query_start_loc.to(torch.long)
    seq_lens = batch.seq_lens.to(torch.long)
    query_lens = query_start[1:] - query_start[:-1]
    offsets = torch.arange(max(batch.max_query_len, 1), device=device)
    query_valid = offsets[None, :] < query_lens[:, None]
    query_index = torch.where(query_valid, query_start[:-1, None] + offsets[None, :], 0)
    query_pos = (seq_lens - query_lens)[:, None] + offsets[None, :]

    positions = torch.arange(max(batch.max_seq_len, 1), device=device)
    key_valid = positions[None, :] < seq_lens[:, None]
    block_index = (positions // block_size).clamp(max=batch.block_table.shape[1] - 1)
    block_ids = batch.block_table[: batch.num_reqs].to(torch.long)[:, block_index]
    key_slots = torch.where(key_valid, block_ids * block_size + positions % block_size, 0)
    return TorchPagedMetadata(
        slot_mapping=batch.slot_mapping[: batch.num_actual_tokens],
        query_index=query_index,
        query_valid=query_valid,
        query_pos=query_pos,
        key_slots=key_slots,
        key_valid=key_valid,
        num_actual_tokens=batch.num_actual_tokens,
        decode=build_decode_view(batch, block_size),
    )


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Store each token's key and value at its slot (divided by the cache's
    scales, computed in float32 as ``x * (1 / scale)``); negative slots are skipped."""
    num_kv_heads, head_size = key.shape[1], key.shape[2]
    key_cache = kv_cache[0].view(-1, num_kv_heads, head_size)
    value_cache = kv_cache[1].view(-1, num_kv_heads, head_size)
    valid = slot_mapping >= 0
    if not bool(valid.all()):
        key, value, slot_mapping = key[valid], value[valid], slot_mapping[valid]
    if (k_scale, v_scale) != (1.0, 1.0):
        key, value = key.to(torch.float32) * (1.0 / k_scale), value.to(torch.float32) * (1.0 / v_scale)
    key, value = key.to(key_cache.dtype), value.to(value_cache.dtype)
    if key_cache.dtype.itemsize == 1 and key_cache.dtype.is_floating_point:
        # fp8 caches: index_copy_ has no fp8 kernel on every device; the
        # bytes are the same, so copy them as uint8.
        key_cache, value_cache = key_cache.view(torch.uint8), value_cache.view(torch.uint8)
        key, value = key.view(torch.uint8), value.view(torch.uint8)
    key_cache.index_copy_(0, slot_mapping, key)
    value_cache.index_copy_(0, slot_mapping, value)


class TorchPagedAttention(AttentionBackend):
    name = "torch_paged"
    supports_kv_scales = True
    supports_logits_soft_cap = True
    supports_sinks = True

    @classmethod
    def supports(cls, spec: AttentionSpec) -> str | None:
        if spec.num_heads % spec.num_kv_heads:
            return f"num_heads ({spec.num_heads}) is not a multiple of num_kv_heads ({spec.num_kv_heads})"
        return None

    def kv_cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        spec = self.spec
        return (2, num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size)

    def build_metadata(self, batch: AttentionBatch) -> TorchPagedMetadata:
        return build_torch_paged_metadata(batch, self.spec.block_size)

    def forward(self, query, key, value, kv_cache, metadata: TorchPagedMetadata, sinks=None) -> torch.Tensor:
        num_tokens = metadata.num_actual_tokens
        write_kv_cache(key[:num_tokens], value[:num_tokens], kv_cache, metadata.slot_mapping, self.k_scale, self.v_scale)
        if metadata.decode is not None:
            return attend_decode(query, kv_cache, metadata.decode, self.spec, self.k_scale, self.v_scale, sinks)
        return paged_attention_reference(query, kv_cache, metadata, self.spec, self.k_scale, self.v_scale, sinks)


def attend_padded(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    query_index: torch.Tensor,
    key_slots: torch.Tensor,
    mask: torch.Tensor,
    spec: AttentionSpec,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Masked attention over a padded batch: queries ``query[query_index]``
    ([B, max_q]) against the cache slots ``key_slots`` ([B, max_s]); returns
    [B, max_q, H, D]. ``sinks``: ``[H]`` sink logits, or None. Shared by the
    torch reference and the static-shape backend."""
    key_cache = kv_cache[0].view(-1, spec.num_kv_heads, spec.head_size)
    value_cache = kv_cache[1].view(-1, spec.num_kv_heads, spec.head_size)
    q = query[query_index].transpose(1, 2)  # [B, H, max_q, D]
    k = key_cache[key_slots].to(query.dtype).transpose(1, 2)  # [B, Hkv, max_s, D]
    v = value_cache[key_slots].to(query.dtype).transpose(1, 2)
    group = spec.num_heads // spec.num_kv_heads
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    head_sinks = None if sinks is None else sinks.view(spec.num_heads, 1, 1)
    return masked_attention(q, k, v, mask, spec, k_scale, v_scale, head_sinks).transpose(1, 2)


def paged_attention_reference(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    metadata: TorchPagedMetadata,
    spec: AttentionSpec,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of each query token over its request's cached context."""
    mask = metadata.mask(spec.sliding_window)
    out = attend_padded(query, kv_cache, metadata.query_index, metadata.key_slots, mask, spec, k_scale, v_scale, sinks)
    out = out[metadata.query_valid]  # [T, H, D] in batch order
    result = torch.zeros_like(query)
    # Tokens past the requests' query tokens (padding) stay zero.
    result[: out.shape[0]] = out
    return result
