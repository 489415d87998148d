"""Single-token decode attention in plain torch: ``torch_paged``'s fast path.

A decode step (every request computes exactly one token) needs neither the
per-slot gather nor the [B, 1, max_q, max_s] mask that ``torch_paged``
builds for arbitrary batches. Here the keys and values are gathered a whole
block at a time (``block_size`` slots per index instead of one), and the
grouped-query heads share their KV head by a reshape of the query
(``[B, kv_heads, group, D]``) rather than ``repeat_interleave`` copying the
keys and values ``group`` times. A mask is built only when some request's
context is shorter than the longest (batch 1 never needs one) or for a
sliding window.

On a small CPU those copies and the mask were most of the attention's time
(about a quarter of a compiled batch-1 step of a 135M Llama; issue 23); the
math is ``torch_math.masked_attention``, as for ``attend_padded``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo.core.attention import AttentionBatch, AttentionSpec
from octavo.runtime.attention.torch_math import masked_attention


@dataclass
class DecodeView:
    block_ids: torch.Tensor  # [B, n] int64: the n blocks that cover the longest context
    seq_lens: torch.Tensor  # [B] int64
    max_seq_len: int
    uniform: bool  # every request's context is max_seq_len long: no padding keys


def build_decode_view(batch: AttentionBatch, block_size: int) -> DecodeView | None:
    """The view of a step whose requests all compute one token, else None.

    Real requests come first and hold tokens ``0..num_reqs-1`` in order, so
    with one token each the sum of query lengths is ``num_reqs``."""
    if batch.max_query_len != 1 or batch.num_actual_tokens != batch.num_reqs or batch.num_reqs == 0:
        return None
    num_reqs, max_seq_len = batch.num_reqs, max(batch.max_seq_len, 1)
    num_blocks = -(-max_seq_len // block_size)
    seq_lens_host = batch.seq_lens_cpu if batch.seq_lens_cpu is not None else batch.seq_lens
    uniform = bool((seq_lens_host[:num_reqs] == max_seq_len).all())
    return DecodeView(
        block_ids=batch.block_table[:num_reqs, :num_blocks].to(torch.long),
        seq_lens=batch.seq_lens[:num_reqs].to(torch.long),
        max_seq_len=max_seq_len,
        uniform=uniform,
    )


def _mask(view: DecodeView, sliding_window: int | None, device) -> torch.Tensor | None:
    """[B, 1, 1, S] True where the request's single query may attend, or None (all)."""
    if view.uniform and (sliding_window is None or view.max_seq_len <= sliding_window):
        return None
    key_pos = torch.arange(view.max_seq_len, device=device)
    allowed = key_pos[None, :] < view.seq_lens[:, None]
    if sliding_window is not None:
        allowed &= key_pos[None, :] > view.seq_lens[:, None] - 1 - sliding_window
    return allowed[:, None, None, :]


def _gather(kv_cache: torch.Tensor, view: DecodeView, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, kv_heads, S, D] keys and values of each request's context, in one gather."""
    # index_select copies whole blocks; advanced indexing (kv_cache[:, ids]) went element by element, 6x slower.
    num_reqs, num_blocks = view.block_ids.shape
    blocks = kv_cache.index_select(1, view.block_ids.flatten())
    blocks = blocks.view(2, num_reqs, num_blocks, *kv_cache.shape[2:])  # [2, B, n, block_size, kv_heads, D]
    kv = blocks.flatten(2, 3)[:, :, : view.max_seq_len].to(dtype).transpose(2, 3)
    return kv[0], kv[1]


def attend_decode(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    view: DecodeView,
    spec: AttentionSpec,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """[T, H, D] attention output: row ``i < B`` is request ``i``'s, padding
    rows are zero. ``sinks``: ``[H]`` sink logits, or None."""
    num_reqs, kv_heads, head_size = view.block_ids.shape[0], spec.num_kv_heads, spec.head_size
    group = spec.num_heads // kv_heads
    # Query head h reads KV head h // group, as repeat_interleave would arrange it.
    q = query[:num_reqs].view(num_reqs, kv_heads, group, head_size)
    k, v = _gather(kv_cache, view, query.dtype)
    # Rows are (KV head, group member): the sinks take the query's layout.
    head_sinks = None if sinks is None else sinks.view(kv_heads, group, 1)
    mask = _mask(view, spec.sliding_window, query.device)
    out = masked_attention(q, k, v, mask, spec, k_scale, v_scale, head_sinks)
    # Contiguous: a compiled graph around the opaque op expects the query's layout.
    out = out.reshape(num_reqs, spec.num_heads, head_size).contiguous()
    if query.shape[0] == num_reqs:
        return out
    result = torch.zeros_like(query)
    result[:num_reqs] = out
    return result
