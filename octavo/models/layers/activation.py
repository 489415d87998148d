"""SiLU-and-multiply: ``silu(x[..., :d]) * x[..., d:]`` (gate, up)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


class SiluAndMul(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.impl = None  # a platform may swap in a fused kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.impl is not None:
            return self.impl(x)
        return silu_and_mul_reference(x)
