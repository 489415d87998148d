"""Token embedding and LM head, split along the vocabulary across TP ranks.

The LM head's projection is the ``linear`` layer op (a skinny-batch kernel
at decode, where the platform has one).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.distributed.parallel_state import (
    get_tp_group,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from octavo.errors import ModelLoadError
from octavo.models.weight_loading import fill_parameter
from octavo.ops import LayerOps, current_layer_ops


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype, prefix: str = "") -> None:
        super().__init__()
        tp = get_tp_group()
        self.tp_rank, self.tp_size = tp.rank, tp.world_size
        self.vocab_size = vocab_size
        # Pad so that every rank holds the same number of rows.
        self.rows_per_rank = -(-vocab_size // self.tp_size)
        self.vocab_start = self.tp_rank * self.rows_per_rank
        self.vocab_end = min(self.vocab_start + self.rows_per_rank, vocab_size)
        self.prefix = prefix
        self.weight = nn.Parameter(torch.empty(self.rows_per_rank, hidden_size, dtype=dtype), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor, shard_id=None) -> None:
        if loaded.shape[0] != self.vocab_size or loaded.shape[1] != param.shape[1]:
            raise ModelLoadError(
                f"{self.prefix}: checkpoint tensor has shape {tuple(loaded.shape)}, "
                f"expected {(self.vocab_size, param.shape[1])}"
            )
        if self.tp_size == 1:
            fill_parameter(param, loaded)
            return
        rows = loaded[self.vocab_start : self.vocab_end]
        param.data[: rows.shape[0]].copy_(rows)
        param.data[rows.shape[0] :].zero_()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.vocab_start
        in_range = (local >= 0) & (local < self.vocab_end - self.vocab_start)
        out = F.embedding(torch.where(in_range, local, 0), self.weight)
        out = out * in_range[:, None].to(out.dtype)
        return tensor_model_parallel_all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection; ``tie_to`` shares the embedding's weight."""

    def __init__(
        self,
        vocab_size,
        hidden_size,
        dtype,
        prefix: str = "",
        tie_to: VocabParallelEmbedding | None = None,
        ops: LayerOps | None = None,
    ):
        super().__init__(vocab_size, hidden_size, dtype, prefix)
        if tie_to is not None:
            self.weight = tie_to.weight
        self.ops = ops or current_layer_ops()

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = self.ops.linear(hidden_states, self.weight, None)
        if self.tp_size > 1:
            logits = tensor_model_parallel_all_gather(logits, dim=-1)
        return logits[..., : self.vocab_size]
