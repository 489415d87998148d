"""The attention layer: hands q, k, v to the platform's attention backend.

Which backend runs is decided when the model is built (the platform picks
it); the per-step metadata and the KV caches arrive in the ``ForwardContext``
passed down the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from octavo.core.attention import AttentionBackend


@dataclass
class ForwardContext:
    """What every layer needs for one step besides activations."""

    attn_metadata: Any
    kv_caches: list[torch.Tensor]


class Attention(nn.Module):
    def __init__(self, backend: AttentionBackend, layer_index: int) -> None:
        super().__init__()
        self.backend = backend
        self.layer_index = layer_index
        self.num_heads = backend.spec.num_heads
        self.num_kv_heads = backend.spec.num_kv_heads
        self.head_size = backend.spec.head_size

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        num_tokens = q.shape[0]
        out = self.backend.forward(
            q.view(num_tokens, self.num_heads, self.head_size),
            k.view(num_tokens, self.num_kv_heads, self.head_size),
            v.view(num_tokens, self.num_kv_heads, self.head_size),
            ctx.kv_caches[self.layer_index],
            ctx.attn_metadata,
        )
        return out.reshape(num_tokens, self.num_heads * self.head_size)
