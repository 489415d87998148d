"""Rotary position embeddings (the GPT-NeoX "rotate half" layout HF uses).

Supported ``rope_type``s: default, linear, llama3 (Llama 3.1), yarn (with
DeepSeek's ``mscale``) and longrope (Phi-3). The cos/sin table is computed
once in float32 and indexed by position; layers with the same rotary
parameters share one table (computing it per layer was a measurable part of
a small model's start-up). The rotation is the ``rotary_embedding`` layer op
(``octavo.ops``).

Partial rotary (``partial_rotary_factor`` < 1: Phi-4-mini, GLM) rotates the
first ``rotary_dim`` dims of each q/k head and passes the rest through, as
HF does; the table and the frequencies are ``rotary_dim`` wide
(``RotaryEmbedding.rotate_leading``).

The interleaved-pairs layout (ERNIE 4.5: ``(x[2i], x[2i+1])`` rotate
together) is ``InterleavedRotaryEmbedding``, plain torch from the same
table: the op and the fused ``rotary_and_cache`` rotate halves, so layers
of this layout never reach them (``fusable``).

LongRoPE has two sets of per-dimension factors: Hugging Face uses the long
ones for a whole forward pass once the sequence passes
``original_max_position_embeddings``, the short ones otherwise. A paged
cache cannot re-rotate keys it already holds, so the set is chosen once from
``max_model_len``: long factors when it exceeds the original length (what HF
does for a prompt that long), short factors otherwise (exactly HF for every
sequence that fits).
"""

from __future__ import annotations

import json
import math
import weakref
from typing import Any

import torch
from torch import nn

from octavo.errors import UnsupportedModelError
from octavo.ops import LayerOps, current_layer_ops
from octavo.ops.reference import rotary_embedding as apply_rotary_reference

__all__ = [
    "InterleavedRotaryEmbedding", "RotaryEmbedding", "apply_rotary_interleaved", "apply_rotary_reference",
    "compute_inv_freq", "cos_sin_table",
]


def _llama3_inv_freq(inv_freq: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    factor = params["factor"]
    low_freq_factor = params.get("low_freq_factor", 1.0)
    high_freq_factor = params.get("high_freq_factor", 4.0)
    old_context_len = params["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature ``0.1 * mscale * ln(factor) + 1`` (1 without scaling)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn_inv_freq(inv_freq: torch.Tensor, dim: int, base: float, params: dict[str, Any], max_pos: int):
    factor = params["factor"]
    original = params.get("original_max_position_embeddings") or max_pos
    beta_fast, beta_slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    inv_freq = (inv_freq / factor) * (1 - extrapolation) + inv_freq * extrapolation
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all_dim:  # DeepSeek: the ratio, the rest goes into the softmax scale
            attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_mscale(factor)
    return inv_freq, attention_factor


def _longrope_inv_freq(inv_freq_shape: torch.Tensor, base: float, params: dict[str, Any], max_pos: int):
    original = params["original_max_position_embeddings"]
    factor = params.get("factor") or 1.0
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    factors = params["long_factor"] if max_pos > original else params["short_factor"]
    if len(factors) != inv_freq_shape.shape[0]:
        raise UnsupportedModelError(f"rope {'long' if max_pos > original else 'short'}_factor has {len(factors)} values, expected {inv_freq_shape.shape[0]}")
    ext = torch.tensor(factors, dtype=torch.float32)
    return 1.0 / (ext * base**inv_freq_shape), attention_factor


def compute_inv_freq(head_size: int, base: float, rope_params: dict[str, Any] | None, max_pos: int):
    """Inverse frequencies and the cos/sin scaling for ``rope_params``."""
    dim = head_size
    inv_freq_shape = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    inv_freq = 1.0 / (base**inv_freq_shape)
    rope_type = (rope_params or {}).get("rope_type") or (rope_params or {}).get("type") or "default"
    if rope_type == "default":
        return inv_freq, 1.0
    if rope_type == "linear":
        return inv_freq / rope_params["factor"], 1.0
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, rope_params), 1.0
    if rope_type == "yarn":
        return _yarn_inv_freq(inv_freq, dim, base, rope_params, max_pos)
    if rope_type == "longrope":
        return _longrope_inv_freq(inv_freq_shape, base, rope_params, max_pos)
    raise UnsupportedModelError(f"rope_type {rope_type!r} is not supported (default, linear, llama3, yarn, longrope are)")


# (head_size, max_position, base, rope params, device) -> the table, while some module holds it.
_shared_tables: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def cos_sin_table(head_size: int, max_position: int, base: float, rope_params: dict[str, Any] | None) -> torch.Tensor:
    """``[max_position, head_size]``: cos then sin halves, on the default device; shared while in use."""
    key = (head_size, max_position, base, json.dumps(rope_params, sort_keys=True), str(torch.get_default_device()))
    table = _shared_tables.get(key)
    if table is None:
        inv_freq, scaling = compute_inv_freq(head_size, base, rope_params, max_position)
        positions = torch.arange(max_position, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq[None, :]
        table = _shared_tables[key] = torch.cat([freqs.cos() * scaling, freqs.sin() * scaling], dim=-1)
    return table


class RotaryEmbedding(nn.Module):

    def __init__(
        self,
        head_size: int,
        max_position: int,
        base: float,
        rope_params: dict[str, Any] | None,
        ops: LayerOps | None = None,
        rotary_dim: int | None = None,
    ) -> None:
        """``rotary_dim``: how many leading dims of each head rotate (None: all);
        the table is that wide."""
        super().__init__()
        self.head_size = head_size
        self.rotary_dim = head_size if rotary_dim is None else rotary_dim
        if not 0 < self.rotary_dim <= head_size or self.rotary_dim % 2:
            raise UnsupportedModelError(
                f"rotary_dim {self.rotary_dim} for heads of {head_size}: must be even, in (0, {head_size}]"
            )
        self.is_partial = self.rotary_dim < head_size
        table = cos_sin_table(self.rotary_dim, max_position, base, rope_params)
        self.register_buffer("cos_sin_cache", table, persistent=False)
        self.ops = ops or current_layer_ops()

    @property
    def fusable(self) -> bool:
        """Whether an attention backend's fused ``rotary_and_cache`` (rotate-half
        over the whole head) computes this rotation; where not, the attention
        layer rotates with the module itself, then plain ``forward``s. It
        writes whole heads rotated from a table as wide as the head, so a
        partial rotary is not fusable."""
        return not self.is_partial

    def forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor):
        """``(query, key)`` rotated at ``positions`` (possibly in place: use the result)."""
        if not self.is_partial:
            return self.ops.rotary_embedding(positions, query, key, self.cos_sin_cache)
        return self.rotate_leading(positions, query, key)

    def rotate_leading(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor):
        """Partial rotary: the ``rotary_embedding`` op on views of each head's
        first ``rotary_dim`` dims with the table as wide, which is the op's
        plain contract (strided views, last dim contiguous), so that every
        implementation serves it as is; the other dims pass through."""
        q_rot, k_rot = query[..., : self.rotary_dim], key[..., : self.rotary_dim]
        q_out, k_out = self.ops.rotary_embedding(positions, q_rot, k_rot, self.cos_sin_cache)
        # An implementation that rotated the views in place returns them; one
        # that made new tensors has its result copied over them.
        if q_out is not q_rot:
            q_rot.copy_(q_out)
        if k_out is not k_rot:
            k_rot.copy_(k_out)
        return query, key


def apply_rotary_interleaved(
    positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``query`` ``[T, H, D]`` and ``key`` ``[T, Hkv, D]`` at ``positions``,
    interleaved-pairs layout (GPT-J, ERNIE 4.5): pair ``(x[2i], x[2i+1])``
    turns by frequency ``i``'s angle, ``x[2i]' = x[2i] cos - x[2i+1] sin``,
    ``x[2i+1]' = x[2i+1] cos + x[2i] sin``, with ``cos_sin_cache`` as for
    ``rotary_embedding`` (``[max_position, D]``: cos then sin halves).
    Computed in float32 and rounded once to the input dtype, as HF's ERNIE
    does. A table narrower than the head (partial rotary, as GLM's) rotates
    the leading dims it covers and passes the rest through. Positions are
    clamped to the table (as the Triton kernels do), so padding tokens of a
    captured graph stay in bounds. Returns new tensors."""
    cos_sin = cos_sin_cache[positions.clamp(0, cos_sin_cache.shape[0] - 1)].float()
    rotary_dim = cos_sin.shape[-1]
    half = rotary_dim // 2
    cos, sin = cos_sin[:, None, :half], cos_sin[:, None, half:]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        pairs = x[..., :rotary_dim].float().unflatten(-1, (half, 2))
        even, odd = pairs[..., 0], pairs[..., 1]
        rotated = torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2).to(x.dtype)
        return rotated if rotary_dim == x.shape[-1] else torch.cat([rotated, x[..., rotary_dim:]], dim=-1)

    return rotate(query), rotate(key)


class InterleavedRotaryEmbedding(RotaryEmbedding):
    """RoPE over interleaved pairs (``apply_rotary_interleaved``). The
    ``rotary_embedding`` op and the fused ``rotary_and_cache`` rotate halves,
    so this one rotates in plain torch on every platform (a few more launches
    than the fused kernel), and backends' fused path is not taken
    (``fusable``)."""

    fusable = False

    def forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor):
        return apply_rotary_interleaved(positions, query, key, self.cos_sin_cache)
