"""The attention math the plain-torch backends share: queries against keys and
values already gathered, one boolean mask, optional logit soft-capping and
attention sinks.

``q`` ``[..., Lq, D]`` against ``k`` / ``v`` ``[..., S, D]`` (batch and head
dimensions broadcast as ``torch.matmul`` does); ``mask`` True where a query may
attend, or None for all. Without soft-capping or sinks,
``scaled_dot_product_attention``; with either, the same math spelled out as
Hugging Face's eager attention does: scores, ``cap * tanh(s / cap)``, mask,
softmax in float32, back to the dtype. Sinks (gpt-oss) are one more logit per
row, a column appended to the scores before the softmax and dropped after
it: they take probability mass and contribute no value. An fp8 cache's
``k_scale`` folds into the score scale and ``v_scale`` into the output.
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
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """``sinks``: each row's sink logit, shaped to broadcast against the
    scores' ``[..., Lq, 1]`` (the caller lays the heads out as ``q`` does)."""
    scale = spec.scale * k_scale
    if spec.logits_soft_cap is None and sinks is None:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    else:
        scores = torch.matmul(q, k.transpose(-2, -1)) * scale
        if spec.logits_soft_cap is not None:
            scores = torch.tanh(scores / spec.logits_soft_cap) * spec.logits_soft_cap
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        if sinks is None:
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
        else:
            scores = scores.to(torch.float32)
            sink = sinks.to(torch.float32).expand(*scores.shape[:-1], 1)
            probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        out = torch.matmul(probs.to(q.dtype), v)
    if v_scale != 1.0:
        out = out * v_scale
    return out
