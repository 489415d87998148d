"""Pooling: per-token hidden states -> one vector per sequence, and what a
request's ``PoolingParams`` then do to that vector.

Device side (``pool_tokens``): the sentence-transformers pooling modes over
a flat batch described by ``PoolingMetadata`` (sequence ``i`` is rows
``cu_seqlens[i]:cu_seqlens[i+1]`` of the hidden states), accumulated in
float32 as sentence-transformers does for half-precision inputs.

Host side (``finish_pooled``): per request (vectorised over the requests
that share their params), Matryoshka truncation then L2 normalisation for
embeddings (the order OpenAI's ``dimensions`` implies: truncated vectors come
back unit-length), or the classifier's activation for scores. The result is
float32, little-endian bytes: what crosses processes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from octavo.core.pooling_params import PoolerConfig, PoolingParams

# sentence-transformers' names (1_Pooling/config.json).
POOLING_MODES = ("cls", "lasttoken", "mean", "max", "mean_sqrt_len_tokens", "weightedmean")
# F.normalize's floor on the norm (what sentence-transformers' Normalize uses).
NORM_EPS = 1e-12


@dataclass
class PoolingMetadata:
    cu_seqlens: torch.Tensor  # [num_seqs + 1] int64, on the device
    seq_lens: torch.Tensor  # [num_seqs] int64
    segment_ids: torch.Tensor  # [num_tokens] int64: each token's sequence
    num_tokens: int

    @staticmethod
    def host_arrays(seq_lens: np.ndarray) -> dict[str, np.ndarray]:
        """``cu_seqlens``, ``seq_lens`` and ``segment_ids`` on the host."""
        seq_lens = np.asarray(seq_lens, dtype=np.int64)
        cu_seqlens = np.zeros(len(seq_lens) + 1, dtype=np.int64)
        np.cumsum(seq_lens, out=cu_seqlens[1:])
        segment_ids = np.repeat(np.arange(len(seq_lens), dtype=np.int64), seq_lens)
        return {"cu_seqlens": cu_seqlens, "seq_lens": seq_lens, "segment_ids": segment_ids}

    @classmethod
    def on_device(cls, arrays: dict[str, torch.Tensor]) -> PoolingMetadata:
        """The metadata of ``host_arrays``' arrays once on the device."""
        segment_ids = arrays["segment_ids"]
        return cls(arrays["cu_seqlens"], arrays["seq_lens"], segment_ids, segment_ids.shape[0])

    @classmethod
    def build(cls, seq_lens: np.ndarray, device: torch.device) -> PoolingMetadata:
        arrays = cls.host_arrays(seq_lens)
        return cls.on_device({name: torch.from_numpy(a).to(device, non_blocking=True) for name, a in arrays.items()})

    @property
    def first_rows(self) -> torch.Tensor:
        return self.cu_seqlens[:-1]

    @property
    def last_rows(self) -> torch.Tensor:
        return self.cu_seqlens[1:] - 1


def _segment_sum(values: torch.Tensor, meta: PoolingMetadata) -> torch.Tensor:
    out = torch.zeros(len(meta.seq_lens), values.shape[1], dtype=values.dtype, device=values.device)
    return out.index_add_(0, meta.segment_ids, values)


def pool_tokens(hidden: torch.Tensor, meta: PoolingMetadata, mode: str) -> torch.Tensor:
    """[num_seqs, hidden] float32, pooled by ``mode`` (one of POOLING_MODES)."""
    if mode == "cls":
        return hidden[meta.first_rows].float()
    if mode == "lasttoken":
        return hidden[meta.last_rows].float()
    tokens = hidden[: meta.num_tokens].float()
    lengths = meta.seq_lens.to(torch.float32)[:, None]
    if mode == "mean":
        return _segment_sum(tokens, meta) / lengths
    if mode == "mean_sqrt_len_tokens":
        return _segment_sum(tokens, meta) / lengths.sqrt()
    if mode == "weightedmean":
        # Weights 1, 2, ... along each sequence.
        weights = (torch.arange(meta.num_tokens, device=tokens.device) - meta.cu_seqlens[meta.segment_ids] + 1).float()
        return _segment_sum(tokens * weights[:, None], meta) / _segment_sum(weights[:, None], meta)
    if mode == "max":
        out = torch.full((len(meta.seq_lens), tokens.shape[1]), float("-inf"), device=tokens.device)
        index = meta.segment_ids[:, None].expand_as(tokens)
        return out.scatter_reduce_(0, index, tokens, reduce="amax")
    raise ValueError(f"unknown pooling mode {mode!r}")


def pool_modes(hidden: torch.Tensor, meta: PoolingMetadata, modes: list[str]) -> torch.Tensor:
    """Each mode's vector, concatenated in order (as sentence-transformers does)."""
    pooled = [pool_tokens(hidden, meta, mode) for mode in modes]
    return pooled[0] if len(pooled) == 1 else torch.cat(pooled, dim=-1)


def _finish_group(rows: np.ndarray, params: PoolingParams, pooler: PoolerConfig) -> np.ndarray:
    """Rows that share their params: Matryoshka + L2 for embeddings, the activation for scores."""
    if pooler.task == "embed":
        if params.dimensions is not None:
            rows = rows[:, : params.dimensions]
        normalize = pooler.normalize if params.normalize is None else params.normalize
        if normalize:
            rows = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), NORM_EPS)
        return rows
    activation = pooler.activation if params.use_activation is not False else "none"
    if activation == "softmax":
        exp = np.exp(rows - rows.max(axis=1, keepdims=True))
        return exp / exp.sum(axis=1, keepdims=True)
    if activation == "sigmoid":
        return 1.0 / (1.0 + np.exp(-rows))
    return rows


def finish_pooled(rows: np.ndarray, params_list: list[PoolingParams], pooler: PoolerConfig) -> list[bytes]:
    """Each row (float32) through its request's params, as float32 little-endian bytes."""
    if params_list and all(params is params_list[0] for params in params_list):
        # One batch's requests usually share one params object (``LLM.embed``): no grouping, no gather.
        return _row_bytes(_finish_group(rows, params_list[0], pooler))
    groups: dict[tuple, list[int]] = {}
    for index, params in enumerate(params_list):
        groups.setdefault((params.dimensions, params.normalize, params.use_activation), []).append(index)
    finished: list[bytes] = [b""] * len(params_list)
    for indices in groups.values():
        for index, row in zip(indices, _row_bytes(_finish_group(rows[indices], params_list[indices[0]], pooler))):
            finished[index] = row
    return finished


def _row_bytes(rows: np.ndarray) -> list[bytes]:
    """Each row's float32 little-endian bytes: slices of one ``tobytes`` (a numpy call per row costs more)."""
    data, width = np.ascontiguousarray(rows, dtype="<f4").tobytes(), rows.shape[1] * 4
    return [data[start : start + width] for start in range(0, width * len(rows), width)] if width else [b""] * len(rows)
