"""RMSNorm, with the residual add fused into the same call.

Math matches Hugging Face: normalise in float32, cast back, then scale.
"""

from __future__ import annotations

import torch
from torch import nn


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)
        self.eps = eps
        # A platform may swap in a fused kernel: fn(x, residual, weight, eps).
        self.fused_add_impl = None
        self.impl = None

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """``norm(x)``; with ``residual``: ``(norm(x + residual), x + residual)``."""
        if residual is None:
            if self.impl is not None:
                return self.impl(x, self.weight, self.eps)
            return rms_norm_reference(x, self.weight, self.eps)
        if self.fused_add_impl is not None:
            return self.fused_add_impl(x, residual, self.weight, self.eps)
        x = x + residual
        return rms_norm_reference(x, self.weight, self.eps), x
