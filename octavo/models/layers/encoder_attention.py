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
    # [num_tokens]: each token's grid cell, row-major (sequence * max_seqlen + position).
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
        token_cells = np.flatnonzero(valid)  # row-major: the tokens' own order
        key_mask = None
        if not valid.all():
            key_mask = torch.from_numpy(valid).to(device, non_blocking=True)[:, None, None, :]
        upload = lambda array: torch.from_numpy(array).to(device, non_blocking=True)  # noqa: E731
        return cls(num_seqs, max_seqlen, upload(grid_index), upload(token_cells), key_mask)


def encoder_attention(qkv: torch.Tensor, num_heads: int, metadata: EncoderAttentionMetadata, scale: float) -> torch.Tensor:
    """``qkv``: [num_tokens, 3 * num_heads * head_size], each token's q, k and v
    one after another; returns [num_tokens, num_heads * head_size], each token
    attending to its own sequence."""
    num_tokens = qkv.shape[0]
    head_size = qkv.shape[1] // (3 * num_heads)
    # One gather puts q, k and v on the grid: [num_seqs, max_seqlen, 3, heads, head_size]
    # (index_select over one flat index each way: the plainest gather torch has).
    grid = qkv.index_select(0, metadata.grid_index)
    grid = grid.view(metadata.num_seqs, metadata.max_seqlen, 3, num_heads, head_size)
    query, key, value = (grid[:, :, i].transpose(1, 2) for i in range(3))
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=metadata.key_mask, scale=scale)
    # One gather takes each token's row back off the grid ([seqs, heads, len, d] -> [tokens, heads, d]).
    cells = out.transpose(1, 2).reshape(metadata.num_seqs * metadata.max_seqlen, num_heads, head_size)
    return cells.index_select(0, metadata.token_cells).reshape(num_tokens, num_heads * head_size)
