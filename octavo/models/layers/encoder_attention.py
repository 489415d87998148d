"""Bidirectional attention over a padding-free batch, for encoder-only models.

The batch is flat: sequence ``i`` holds the tokens ``cu_seqlens[i]:cu_seqlens[i+1]``
and each of them attends to every token of its own sequence and to no other.
Nothing is cached: an encoder computes a whole input in one step.

The step's metadata (built once, on the host, by ``EncoderAttentionMetadata.build``)
lays the flat tokens out on a ``[num_seqs, max_seqlen]`` grid, so that one
``scaled_dot_product_attention`` call covers the batch (torch picks the
kernel for the device; an additive key mask hides the grid's empty cells,
and is left out when every sequence fills its row). Only attention sees that grid:
projections, norms and activations run on the flat tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
    # [num_seqs, 1, 1, max_seqlen] float32: 0 for real keys, -inf for empty
    # cells (what SDPA makes of a bool mask, made here once per step: SDPA
    # converts a bool mask in every layer, a kernel each on a GPU); None when
    # the grid is full.
    key_bias: torch.Tensor | None
    # ``key_bias`` in the other dtypes asked for (``key_bias_in``).
    _key_bias_in: dict[torch.dtype, torch.Tensor] = field(default_factory=dict, repr=False)

    @staticmethod
    def host_arrays(seq_lens: np.ndarray) -> dict[str, np.ndarray]:
        """The step's grid on the host: ``grid_index``, ``token_cells`` and, unless the grid is full, ``key_bias``."""
        seq_lens = np.asarray(seq_lens, dtype=np.int64)
        max_seqlen = int(seq_lens.max())
        starts = np.cumsum(seq_lens) - seq_lens
        offsets = np.arange(max_seqlen, dtype=np.int64)
        valid = offsets[None, :] < seq_lens[:, None]
        arrays = {
            "grid_index": np.where(valid, starts[:, None] + offsets[None, :], starts[:, None]).reshape(-1),
            "token_cells": np.flatnonzero(valid),  # row-major: the tokens' own order
        }
        if not valid.all():
            arrays["key_bias"] = np.where(valid, np.float32(0), np.float32(-np.inf))[:, None, None, :]
        return arrays

    @staticmethod
    def padded_host_arrays(seq_lens: np.ndarray, num_seqs: int, max_seqlen: int, num_tokens: int) -> dict[str, np.ndarray]:
        """``host_arrays`` on a grid of ``num_seqs`` x ``max_seqlen`` for
        ``num_tokens`` flat tokens, at least the real ones (a captured graph's
        fixed shape), ``key_bias`` always. Padding sequences attend to the first
        token only (a row of all ``-inf`` would be NaN); padding tokens read
        cell 0. Neither reaches a real token's output."""
        seq_lens = np.asarray(seq_lens, dtype=np.int64)
        real = len(seq_lens)
        if real > num_seqs or int(seq_lens.max()) > max_seqlen or int(seq_lens.sum()) > num_tokens:
            raise ValueError(f"{real} sequences of up to {int(seq_lens.max())} tokens do not fit the padded grid "
                             f"{num_seqs} x {max_seqlen} of {num_tokens} tokens")
        lengths = np.zeros(num_seqs, dtype=np.int64)
        lengths[:real] = seq_lens
        starts = np.zeros(num_seqs, dtype=np.int64)
        starts[:real] = np.cumsum(seq_lens) - seq_lens
        offsets = np.arange(max_seqlen, dtype=np.int64)
        valid = offsets[None, :] < lengths[:, None]
        token_cells = np.zeros(num_tokens, dtype=np.int64)
        real_cells = np.flatnonzero(valid)
        token_cells[: len(real_cells)] = real_cells
        key_bias = np.where(valid, np.float32(0), np.float32(-np.inf))
        key_bias[real:, 0] = 0
        return {
            "grid_index": np.where(valid, starts[:, None] + offsets[None, :], starts[:, None]).reshape(-1),
            "token_cells": token_cells,
            "key_bias": key_bias[:, None, None, :],
        }

    @classmethod
    def on_device(cls, seq_lens: np.ndarray, arrays: dict[str, torch.Tensor]) -> EncoderAttentionMetadata:
        """The metadata of ``host_arrays``' arrays once on the device (with other arrays of the step: ``upload_together``)."""
        return cls(len(seq_lens), int(np.max(seq_lens)), arrays["grid_index"], arrays["token_cells"], arrays.get("key_bias"))

    @classmethod
    def build(cls, seq_lens: np.ndarray, device: torch.device) -> EncoderAttentionMetadata:
        arrays = cls.host_arrays(seq_lens)
        return cls.on_device(seq_lens, {name: torch.from_numpy(a).to(device, non_blocking=True) for name, a in arrays.items()})

    def key_bias_in(self, dtype: torch.dtype) -> torch.Tensor | None:
        """``key_bias`` in ``dtype`` (the queries'; 0 and -inf are exact in any float dtype), converted once per step."""
        if self.key_bias is None or dtype == self.key_bias.dtype:
            return self.key_bias
        bias = self._key_bias_in.get(dtype)
        if bias is None:
            bias = self._key_bias_in[dtype] = self.key_bias.to(dtype)
        return bias


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
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=metadata.key_bias_in(qkv.dtype), scale=scale)
    # One gather takes each token's row back off the grid ([seqs, heads, len, d] -> [tokens, heads, d]).
    cells = out.transpose(1, 2).reshape(metadata.num_seqs * metadata.max_seqlen, num_heads, head_size)
    return cells.index_select(0, metadata.token_cells).reshape(num_tokens, num_heads * head_size)
