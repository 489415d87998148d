"""Plain-torch references for the kernels in ``octavo.kernels``.

They favour obviousness over speed (a Python loop over requests, float32
math) and are what the kernel tests compare against. The layer ops'
references are the registry's (``octavo.ops.reference``), re-exported here
under the names the kernel tests use; this module imports nothing from
``octavo.models``.
"""

from __future__ import annotations

import torch

from octavo.ops.reference import fused_add_rms_norm as fused_add_rms_norm_reference
from octavo.ops.reference import reshape_and_cache as reshape_and_cache_reference
from octavo.ops.reference import rms_norm as rms_norm_reference
from octavo.ops.reference import rotary_embedding as apply_rotary_reference
from octavo.ops.reference import silu_and_mul as silu_and_mul_reference

__all__ = [
    "apply_rotary_reference",
    "fused_add_rms_norm_reference",
    "merge_attention_parts_reference",
    "paged_attention_reference",
    "reshape_and_cache_reference",
    "rms_norm_reference",
    "silu_and_mul_reference",
]


def paged_attention_reference(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
) -> torch.Tensor:
    """Causal attention of each request's queries over its cached context.

    Request ``i``'s ``q_len`` query tokens are the last of its ``seq_lens[i]``
    tokens; the query at position ``p`` sees keys ``[0, p]`` (``(p - window,
    p]`` with a sliding window); with ``soft_cap`` scores become
    ``soft_cap * tanh(scores / soft_cap)``. Rows outside every request are zeros.
    """
    num_heads, head_size = query.shape[1], query.shape[2]
    block_size, num_kv_heads = kv_cache.shape[2], kv_cache.shape[3]
    group = num_heads // num_kv_heads
    out = torch.zeros_like(query)
    starts = query_start_loc.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        q_start, q_end = starts[i], starts[i + 1]
        q_len = q_end - q_start
        if q_len == 0 or seq_len == 0:
            continue
        blocks = block_table[i, : -(-seq_len // block_size)].long()
        keys = kv_cache[0, blocks].reshape(-1, num_kv_heads, head_size)[:seq_len].float()
        values = kv_cache[1, blocks].reshape(-1, num_kv_heads, head_size)[:seq_len].float()
        keys = keys.repeat_interleave(group, dim=1)
        values = values.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", query[q_start:q_end].float(), keys) * scale
        if soft_cap is not None:
            scores = torch.tanh(scores / soft_cap) * soft_cap
        query_pos = torch.arange(seq_len - q_len, seq_len, device=query.device)
        key_pos = torch.arange(seq_len, device=query.device)
        allowed = key_pos[None, :] <= query_pos[:, None]
        if sliding_window is not None:
            allowed &= key_pos[None, :] > query_pos[:, None] - sliding_window
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        out[q_start:q_end] = torch.einsum("hqk,khd->qhd", probs, values).to(query.dtype)
    return out


def merge_attention_parts_reference(
    first: tuple[torch.Tensor, torch.Tensor], second: tuple[torch.Tensor, torch.Tensor]
) -> torch.Tensor:
    """Softmax over two disjoint key sets from each part's output ``[H, Q, D]``
    and natural log-sum-exp ``[H, Q]``: float32 ``[Q, H, D]``."""
    (out_a, lse_a), (out_b, lse_b) = first, second
    top = torch.maximum(lse_a, lse_b).float()
    top = torch.where(top == float("-inf"), torch.zeros_like(top), top)
    weight_a, weight_b = torch.exp(lse_a.float() - top), torch.exp(lse_b.float() - top)
    total = weight_a + weight_b
    total = torch.where(total == 0, torch.ones_like(total), total)
    merged = (out_a.float() * weight_a[..., None] + out_b.float() * weight_b[..., None]) / total[..., None]
    return merged.transpose(0, 1)
