"""The attention layer: hands q, k, v to the platform's attention backend.

Which backend runs is decided when the model is built (the platform picks
it); the per-step metadata and the KV caches arrive in the ``ForwardContext``
passed down the model. With a backend that ``fuses_rotary``, the rotary
embedding and the KV write run as one ``rotary_and_cache`` layer op (the
one resolved for this model), which the backend calls in
``forward_with_rotary``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from octavo.core.attention import AttentionBackend
from octavo.ops import LayerOps, current_layer_ops


@dataclass
class ForwardContext:
    """What every layer needs for one step besides activations."""

    attn_metadata: Any
    kv_caches: list[torch.Tensor]


def _takes_rotary_op(backend: AttentionBackend) -> bool:
    """Plugin API 1.1 passes the resolved ``rotary_and_cache`` op to
    ``forward_with_rotary``; a 1.0 backend's method takes one argument fewer."""
    return len(inspect.signature(backend.forward_with_rotary).parameters) >= 8


class Attention(nn.Module):
    def __init__(self, backend: AttentionBackend, layer_index: int, ops: LayerOps | None = None) -> None:
        super().__init__()
        self.backend = backend
        self.layer_index = layer_index
        self.num_heads = backend.spec.num_heads
        self.num_kv_heads = backend.spec.num_kv_heads
        self.head_size = backend.spec.head_size
        ops = ops or current_layer_ops()
        self.fuses_rotary = bool(backend.fuses_rotary)
        self.rotary_args = (ops.rotary_and_cache,) if self.fuses_rotary and _takes_rotary_op(backend) else ()

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
        if rotary is not None and self.fuses_rotary:
            out = self.backend.forward_with_rotary(
                q, k, v, kv_cache, ctx.attn_metadata, positions, rotary.cos_sin_cache, *self.rotary_args
            )
        else:
            if rotary is not None:
                q, k = rotary(positions, q, k)
            out = self.backend.forward(q, k, v, kv_cache, ctx.attn_metadata)
        return out.reshape(num_tokens, self.num_heads * self.head_size)
