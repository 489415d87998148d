"""RMSNorm, with the residual add fused into the same call.

The math is the ``rms_norm`` / ``fused_add_rms_norm`` layer ops
(``octavo.ops``; references match Hugging Face: normalise in float32, cast
back, then scale), as resolved for the model this layer belongs to.
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.ops import LayerOps, current_layer_ops
from octavo.ops.reference import rms_norm as rms_norm_reference

__all__ = ["RMSNorm", "rms_norm_reference"]


class RMSNorm(nn.Module):
    def __init__(
        self, hidden_size: int, eps: float = 1e-6, dtype: torch.dtype = torch.float32, ops: LayerOps | None = None
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)
        self.eps = eps
        self.ops = ops or current_layer_ops()

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """``norm(x)``; with ``residual``: ``(norm(x + residual), x + residual)``."""
        if residual is None:
            return self.ops.rms_norm(x, self.weight, self.eps)
        return self.ops.fused_add_rms_norm(x, residual, self.weight, self.eps)
