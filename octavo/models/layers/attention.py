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

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        ctx: ForwardContext,
        positions: torch.Tensor | None = None,
        rotary: nn.Module | None = None,
    ) -> torch.Tensor:
        """Attention of ``q`` over the cached context, after ``rotary`` (a
        ``RotaryEmbedding``) rotates ``q`` and ``k`` at ``positions`` if given."""
        num_tokens = q.shape[0]
        q = q.view(num_tokens, self.num_heads, self.head_size)
        k = k.view(num_tokens, self.num_kv_heads, self.head_size)
        v = v.view(num_tokens, self.num_kv_heads, self.head_size)
        kv_cache = ctx.kv_caches[self.layer_index]
        # The fused kernel replaces the platform's rotary kernel, so only
        # where one is installed: elsewhere the layer's torch code is the reference.
        if rotary is not None and self.backend.fuses_rotary and rotary.impl is not None:
            out = self.backend.forward_with_rotary(q, k, v, kv_cache, ctx.attn_metadata, positions, rotary.cos_sin_cache)
        else:
            if rotary is not None:
                q, k = rotary(positions, q, k)
            out = self.backend.forward(q, k, v, kv_cache, ctx.attn_metadata)
        return out.reshape(num_tokens, self.num_heads * self.head_size)
