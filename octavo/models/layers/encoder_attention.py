"""Bidirectional attention over a padding-free batch, for encoder-only models.

The batch is flat: sequence ``i`` holds the tokens ``cu_seqlens[i]:cu_seqlens[i+1]``
and each of them attends to every token of its own sequence and to no other.
Nothing is cached: an encoder computes a whole input in one step.

The step's metadata (built once, on the host, by ``EncoderAttentionMetadata.build``)
holds the sequences' boundaries (``cu_seqlens``, what a varlen kernel
reads) and lays the flat tokens out on a ``[num_seqs, max_seqlen]`` grid,
so that the ``encoder_attention`` layer op's reference covers the batch with
one ``scaled_dot_product_attention`` call (an additive key mask hides the
grid's empty cells, and is left out when every sequence fills its row).
Only attention sees the grid: projections, norms and activations run on
the flat tokens. CUDA's implementation of the op (``kernels/encoder_attention.py``)
is torch's varlen flash attention, on the flat tokens directly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch


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
    # [num_seqs + 1] int32: sequence i is the flat tokens cu_seqlens[i]:cu_seqlens[i+1]
    # (what a varlen attention kernel reads instead of the grid).
    cu_seqlens: torch.Tensor
    # ``key_bias`` in the other dtypes asked for (``key_bias_in``).
    _key_bias_in: dict[torch.dtype, torch.Tensor] = field(default_factory=dict, repr=False)

    @staticmethod
    def host_arrays(seq_lens: np.ndarray) -> dict[str, np.ndarray]:
        """The step's grid on the host: ``grid_index``, ``token_cells``,
        ``attn_cu_seqlens`` and, unless the grid is full, ``key_bias``
        (``padded_host_arrays`` at the step's own shape)."""
        seq_lens = np.asarray(seq_lens, dtype=np.int64)
        arrays = EncoderAttentionMetadata.padded_host_arrays(seq_lens, len(seq_lens), int(seq_lens.max()), int(seq_lens.sum()))
        if not np.isinf(arrays["key_bias"]).any():  # every sequence fills its row: no mask
            del arrays["key_bias"]
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
        cu_seqlens = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)  # padding sequences: empty
        return {
            "grid_index": np.where(valid, starts[:, None] + offsets[None, :], starts[:, None]).reshape(-1),
            "token_cells": token_cells,
            "key_bias": key_bias[:, None, None, :],
            "attn_cu_seqlens": cu_seqlens,
        }

    @classmethod
    def on_device(cls, seq_lens: np.ndarray, arrays: dict[str, torch.Tensor]) -> EncoderAttentionMetadata:
        """The metadata of ``host_arrays``' arrays once on the device (with other arrays of the step: ``upload_together``)."""
        return cls(
            len(seq_lens), int(np.max(seq_lens)), arrays["grid_index"], arrays["token_cells"], arrays.get("key_bias"),
            arrays["attn_cu_seqlens"],
        )

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


def encoder_attention(
    op: Callable, qkv: torch.Tensor, num_heads: int, metadata: EncoderAttentionMetadata, scale: float
) -> torch.Tensor:
    """``qkv``: [num_tokens, 3 * num_heads * head_size], each token's q, k and v
    one after another; returns [num_tokens, num_heads * head_size], each token
    attending to its own sequence, by ``op`` (the model's ``encoder_attention``
    layer op: the grid SDPA reference, or a varlen kernel that reads ``cu_seqlens``)."""
    return op(
        qkv, metadata.cu_seqlens, metadata.max_seqlen, metadata.grid_index, metadata.token_cells,
        metadata.key_bias_in(qkv.dtype), num_heads, scale,
    )
