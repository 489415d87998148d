"""RMSNorm, with the residual add fused into the same call.

``RMSNorm``'s math is the ``rms_norm`` / ``fused_add_rms_norm`` layer ops
(``octavo.ops``; references match Hugging Face: normalise in float32, cast
back, then scale), as resolved for the model this layer belongs to.
``Float32ScaleRMSNorm`` (Gemma 2/3, OLMo 2) scales in float32 before
casting, by ``weight`` or, for Gemma, by ``1 + weight``.
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.ops import LayerOps, current_layer_ops
from octavo.ops.reference import rms_norm as rms_norm_reference

__all__ = ["Float32ScaleRMSNorm", "RMSNorm", "rms_norm_f32_scale_reference", "rms_norm_reference"]


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


def rms_norm_f32_scale_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float = 0.0):
    """RMSNorm scaled in float32 before casting back (Gemma, OLMo 2), by ``weight_offset + weight``."""
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (x32 * (weight_offset + weight.to(torch.float32))).to(x.dtype)


class Float32ScaleRMSNorm(nn.Module):
    """RMSNorm scaled in float32 by ``weight_offset + weight`` (same call forms as ``RMSNorm``).

    Hugging Face rounds Gemma's and OLMo 2's norms differently from Llama's
    (scale, then cast); the ``rms_norm`` op rounds as Llama does, so these
    norms keep their own math (no layer op)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, dtype: torch.dtype = torch.float32, weight_offset: float = 0.0):
        super().__init__()
        # Gemma stores the scale minus one (zeros = identity).
        self.weight = nn.Parameter(torch.full((hidden_size,), 1.0 - weight_offset, dtype=dtype), requires_grad=False)
        self.eps = eps
        self.weight_offset = weight_offset

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return rms_norm_f32_scale_reference(x, self.weight, self.eps, self.weight_offset)
        x = x + residual
        return rms_norm_f32_scale_reference(x, self.weight, self.eps, self.weight_offset), x
