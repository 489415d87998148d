"""The attention math the plain-torch backends share: queries against keys and
values already gathered, one boolean mask, optional logit soft-capping.

``q`` ``[..., Lq, D]`` against ``k`` / ``v`` ``[..., S, D]`` (batch and head
dimensions broadcast as ``torch.matmul`` does); ``mask`` True where a query may
attend, or None for all. Without soft-capping, ``scaled_dot_product_attention``;
with it, the same math spelled out as Hugging Face's eager attention does:
scores, ``cap * tanh(s / cap)``, mask, softmax in float32, back to the dtype.
An fp8 cache's ``k_scale`` folds into the score scale and ``v_scale`` into
the output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from octavo.core.attention import AttentionSpec


def masked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    spec: AttentionSpec,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    scale = spec.scale * k_scale
    if spec.logits_soft_cap is None:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    else:
        scores = torch.matmul(q, k.transpose(-2, -1)) * scale
        scores = torch.tanh(scores / spec.logits_soft_cap) * spec.logits_soft_cap
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)
    if v_scale != 1.0:
        out = out * v_scale
    return out
