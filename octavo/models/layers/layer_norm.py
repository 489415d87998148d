"""LayerNorm (StarCoder 2, Cohere) in ``RMSNorm``'s call forms.

The math is the ``layer_norm`` layer op (``octavo.ops``: normalise, scale
and shift in float32, round once, as Hugging Face's Cohere norm and torch's
``LayerNorm`` do). ``LayerNorm(x, residual)`` adds the residual first and
returns the sum too, as ``RMSNorm`` does, so the decoder's layers take
either norm. ``HeadLayerNorm`` is Cohere's q/k norm: each head normalised
on its own, with a weight of its own (``[heads, head_dim]`` in the
checkpoint), the heads split over tensor-parallel ranks as the q/k
projection splits them.
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.distributed.parallel_state import get_tp_group
from octavo.errors import ModelLoadError
from octavo.ops import LayerOps, current_layer_ops

__all__ = ["HeadLayerNorm", "LayerNorm"]


class LayerNorm(nn.Module):
    def __init__(
        self, hidden_size: int, eps: float, dtype: torch.dtype, bias: bool, ops: LayerOps | None = None
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(hidden_size, dtype=dtype), requires_grad=False) if bias else None
        self.eps = eps
        self.ops = ops or current_layer_ops()

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """``norm(x)``; with ``residual``: ``(norm(x + residual), x + residual)``."""
        if residual is None:
            return self.ops.layer_norm(x, self.weight, self.bias, self.eps)
        summed = x + residual
        return self.ops.layer_norm(summed, self.weight, self.bias, self.eps), summed


class HeadLayerNorm(nn.Module):
    """LayerNorm of each of this rank's heads (``[T, heads, head_size]``) by
    that head's weight. ``num_replicas``: ranks holding the same heads (KV
    heads replicated when there are fewer of them than ranks)."""

    def __init__(
        self, total_heads: int, head_size: int, eps: float, dtype: torch.dtype, num_replicas: int = 1,
        ops: LayerOps | None = None,
    ) -> None:
        super().__init__()
        tp = get_tp_group()
        self.total_heads, self.head_size, self.eps = total_heads, head_size, eps
        self.num_local_heads = total_heads // (tp.world_size // num_replicas)
        self.shard = tp.rank // num_replicas
        self.weight = nn.Parameter(torch.ones(self.num_local_heads, head_size, dtype=dtype), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        self.ops = ops or current_layer_ops()

    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor, shard_id=None) -> None:
        if tuple(loaded.shape) != (self.total_heads, self.head_size):
            raise ModelLoadError(
                f"q/k norm: checkpoint tensor has shape {tuple(loaded.shape)}, "
                f"expected ({self.total_heads}, {self.head_size})"
            )
        param.data.copy_(loaded.narrow(0, self.shard * self.num_local_heads, self.num_local_heads))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.layer_norm(x, self.weight, None, self.eps)
