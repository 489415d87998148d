"""The attention layer: hands q, k, v to the platform's attention backend.

Which backend runs is decided when the model is built (the platform picks
it); the per-step metadata and the KV caches arrive in the ``ForwardContext``
passed down the model. With a backend that ``fuses_rotary``, the rotary
embedding and the KV write run as one ``rotary_and_cache`` layer op (the
one resolved for this model), which the backend calls in
``forward_with_rotary``.

An fp8 KV cache can carry per-layer scales from the checkpoint (vLLM /
llm-compressor ``self_attn.k_scale`` and ``v_scale``, the older single
``kv_scale``, or ``k_proj`` / ``v_proj`` ``output_scale``); the layer holds
them as parameters (1.0 when the checkpoint has none) and hands them to its
backend once loaded (``apply_kv_scales``). They mean nothing to a 16/32-bit
cache, which stores keys and values as they are, and are then not used.
Per-head scales are refused.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from octavo.core.attention import AttentionBackend
from octavo.distributed.parallel_state import get_tp_group
from octavo.errors import ModelLoadError
from octavo.ops import LayerOps, current_layer_ops

KV_SCALE_NAMES = ("k_scale", "v_scale", "kv_scale")
# Checkpoint names of the scales -> the parameters of ``self_attn.attn``.
_KV_SCALE_ALIASES = {
    ".self_attn.k_scale": ".self_attn.attn.k_scale",
    ".self_attn.v_scale": ".self_attn.attn.v_scale",
    ".self_attn.kv_scale": ".self_attn.attn.kv_scale",
    ".self_attn.k_proj.output_scale": ".self_attn.attn.k_scale",
    ".self_attn.v_proj.output_scale": ".self_attn.attn.v_scale",
}


def kv_scale_param_name(name: str) -> str:
    """The parameter a checkpoint's KV-cache scale tensor loads into (other names unchanged)."""
    for suffix, target in _KV_SCALE_ALIASES.items():
        if name.endswith(suffix):
            return name[: -len(suffix)] + target
    return name


def _scale_param() -> nn.Parameter:
    param = nn.Parameter(torch.ones((), dtype=torch.float32), requires_grad=False)
    param.not_in_checkpoint = True  # optional: 1.0 when absent

    def load(target: torch.Tensor, loaded: torch.Tensor, shard_id=None) -> None:
        if loaded.numel() != 1:
            raise ModelLoadError(
                f"a KV-cache scale of shape {tuple(loaded.shape)}: only per-tensor scales are supported, not per-head"
            )
        target.data.copy_(loaded.reshape(()).to(torch.float32))
        target.loaded = True

    param.weight_loader = load
    return param


def attention_sinks_param(num_heads: int) -> nn.Parameter:
    """A layer's sink logits (gpt-oss's ``self_attn.sinks``): this
    tensor-parallel rank's ``num_heads`` of them, kept in float32 (the
    softmax's dtype; a 16-bit checkpoint's values are exact in it)."""
    tp = get_tp_group()
    param = nn.Parameter(torch.zeros(num_heads, dtype=torch.float32), requires_grad=False)

    def load(target: torch.Tensor, loaded: torch.Tensor, shard_id=None) -> None:
        total = num_heads * tp.world_size
        if tuple(loaded.shape) != (total,):
            raise ModelLoadError(f"attention sinks of shape {tuple(loaded.shape)}, expected ({total},)")
        target.data.copy_(loaded.narrow(0, tp.rank * num_heads, num_heads).to(torch.float32))

    param.weight_loader = load
    return param


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
        for name in KV_SCALE_NAMES:
            self.register_parameter(name, _scale_param())

    def apply_kv_scales(self, prefix: str = "") -> None:
        """After loading: give the backend the checkpoint's KV-cache scales
        (an fp8 cache only). The fused rotary + cache write does not scale,
        so a layer with scales other than 1.0 takes the unfused path."""
        cache_dtype = self.backend.spec.kv_cache_dtype
        if cache_dtype.itemsize != 1 or self.k_scale.is_meta:
            return
        kv = float(self.kv_scale) if getattr(self.kv_scale, "loaded", False) else 1.0
        k = float(self.k_scale) if getattr(self.k_scale, "loaded", False) else kv
        v = float(self.v_scale) if getattr(self.v_scale, "loaded", False) else kv
        if not (k > 0 and v > 0):
            raise ModelLoadError(f"{prefix}: KV-cache scales must be positive, got k_scale={k}, v_scale={v}")
        if (k, v) == (1.0, 1.0):
            return
        # Layers of one spec share a backend; one with scales of its own gets its own copy.
        backend = copy.copy(self.backend)
        reason = backend.set_kv_scales(k, v)
        if reason is not None:
            raise ModelLoadError(f"{prefix}: the checkpoint has KV-cache scales (k {k}, v {v}) but {reason}")
        self.backend = backend
        self.fuses_rotary = False

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        ctx: ForwardContext,
        positions: torch.Tensor | None = None,
        rotary: nn.Module | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention of ``q`` over the cached context, after ``rotary`` (a
        ``RotaryEmbedding``) rotates ``q`` and ``k`` at ``positions`` if given
        (None: no rotation at all, e.g. SmolLM3's NoPE layers). The backend's
        fused rotary path is taken only for a rotation it computes
        (``rotary.fusable``: rotate-half over the whole head), and never with
        ``sinks`` (this layer's ``[num_heads]`` sink logits, gpt-oss), which
        only ``forward`` takes."""
        num_tokens = q.shape[0]
        q = q.view(num_tokens, self.num_heads, self.head_size)
        k = k.view(num_tokens, self.num_kv_heads, self.head_size)
        v = v.view(num_tokens, self.num_kv_heads, self.head_size)
        kv_cache = ctx.kv_caches[self.layer_index]
        if rotary is not None and self.fuses_rotary and getattr(rotary, "fusable", True) and sinks is None:
            out = self.backend.forward_with_rotary(
                q, k, v, kv_cache, ctx.attn_metadata, positions, rotary.cos_sin_cache, *self.rotary_args
            )
        else:
            if rotary is not None:
                q, k = rotary(positions, q, k)
            if sinks is None:
                out = self.backend.forward(q, k, v, kv_cache, ctx.attn_metadata)
            else:
                out = self.backend.forward(q, k, v, kv_cache, ctx.attn_metadata, sinks=sinks)
        return out.reshape(num_tokens, self.num_heads * self.head_size)
