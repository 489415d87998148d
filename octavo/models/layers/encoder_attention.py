"""Bidirectional attention over a padding-free batch, for encoder-only models.

The batch is flat: sequence ``i`` holds the tokens ``cu_seqlens[i]:cu_seqlens[i+1]``
and each of them attends to every token of its own sequence and to no other.
Nothing is cached: an encoder computes a whole input in one step.

The step's metadata (built once, on the host, by ``EncoderAttentionMetadata.build``)
lays the flat tokens out on a ``[num_seqs, max_seqlen]`` grid, so that one
``scaled_dot_product_attention`` call covers the batch (torch picks the
kernel for the device; a key mask hides the grid's empty cells, and is left
out when every sequence fills its row). Only attention sees that grid:
projections, norms and activations run on the flat tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F


@dataclass
class EncoderAttentionMetadata:
    num_seqs: int
    max_seqlen: int
    # [num_seqs * max_seqlen]: the flat token in each grid cell (an empty cell
    # repeats its sequence's first token; it is masked out as a key).
    grid_index: torch.Tensor
    # [num_tokens]: each token's grid cell, in token order.
    token_cells: torch.Tensor
    # [num_seqs, 1, 1, max_seqlen]: True for real keys; None when the grid is full.
    key_mask: torch.Tensor | None

    @classmethod
    def build(cls, seq_lens: np.ndarray, device: torch.device) -> EncoderAttentionMetadata:
        seq_lens = np.asarray(seq_lens, dtype=np.int64)
        num_seqs, max_seqlen = len(seq_lens), int(seq_lens.max())
        starts = np.cumsum(seq_lens) - seq_lens
        offsets = np.arange(max_seqlen, dtype=np.int64)
        valid = offsets[None, :] < seq_lens[:, None]
        grid_index = np.where(valid, starts[:, None] + offsets[None, :], starts[:, None]).reshape(-1)
        key_mask = None
        if not valid.all():
            key_mask = torch.from_numpy(valid).to(device, non_blocking=True)[:, None, None, :]
        return cls(
            num_seqs=num_seqs,
            max_seqlen=max_seqlen,
            grid_index=torch.from_numpy(grid_index).to(device, non_blocking=True),
            token_cells=torch.from_numpy(np.flatnonzero(valid)).to(device, non_blocking=True),
            key_mask=key_mask,
        )


def encoder_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, metadata: EncoderAttentionMetadata, scale: float
) -> torch.Tensor:
    """``query``, ``key``, ``value``: [num_tokens, num_heads, head_size]; returns
    [num_tokens, num_heads * head_size], each token attending to its own sequence."""
    num_heads, head_size = query.shape[1], query.shape[2]
    shape = (metadata.num_seqs, metadata.max_seqlen, num_heads, head_size)

    def on_grid(x: torch.Tensor) -> torch.Tensor:
        return x[metadata.grid_index].view(shape).transpose(1, 2)

    out = F.scaled_dot_product_attention(
        on_grid(query), on_grid(key), on_grid(value), attn_mask=metadata.key_mask, scale=scale
    )
    out = out.transpose(1, 2).reshape(metadata.num_seqs * metadata.max_seqlen, num_heads * head_size)
    return out[metadata.token_cells]
