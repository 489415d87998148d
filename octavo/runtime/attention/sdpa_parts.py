"""One request's causal attention through torch's fused attention kernels.

``causal_sdpa``: a prompt with no cached context, through the public
``scaled_dot_product_attention`` with cuDNN preferred (then FlashAttention,
memory-efficient, math: the first that takes the call).

``chunk_attention``: a chunk of a longer prompt, whose queries are the last
``Q`` of ``C + Q`` positions. SDPA's bottom-right causal mask never reaches
cuDNN (torch dispatches it to FlashAttention-2 or slower), so the chunk is
attended in two parts, each through one fused kernel that also returns its
log-sum-exp: the cached context, which every query sees whole (no mask), and
the chunk's own keys under the square causal mask. The parts merge by their
log-sum-exps (``merge_parts``), as split-KV decode merges its splits.

The fused kernels that return a log-sum-exp are ATen's own ops, not public
API: cuDNN's (then FlashAttention-2's) on CUDA, the CPU flash kernel on the
CPU; KV heads are repeated for them (grouped heads are SDPA's, not theirs).
Shapes: ``q`` [1, H, Q, D]; keys and values [1, Hkv, S, D]; outputs [1, H, Q, D].
"""

from __future__ import annotations

import torch


def causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Square causal attention (``Q == S``), the fastest SDPA backend that takes it."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    with sdpa_kernel(order, set_priority=True):
        if k.shape[1] == q.shape[1]:
            return sdpa(q, k, v, is_causal=True, scale=scale)
        return sdpa(q, k, v, is_causal=True, scale=scale, enable_gqa=True)


def chunk_attention(
    q: torch.Tensor, context: tuple[torch.Tensor, torch.Tensor], own: tuple[torch.Tensor, torch.Tensor], scale: float
) -> torch.Tensor:
    """Queries that follow ``context`` (keys, values) and attend causally over ``own``."""
    whole = attention_with_lse(q, *context, scale, causal=False)
    causal = attention_with_lse(q, *own, scale, causal=True)
    return merge_parts(whole, causal).to(q.dtype)


def attention_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [1, H, Q, D], natural log-sum-exp of each row's scores [1, H, Q] float32)."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    aten = torch.ops.aten
    if q.device.type == "cpu":
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
    else:
        try:
            out, lse = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False, scale=scale)[:2]
        except RuntimeError:  # cuDNN without attention, or not for these shapes
            out, lse = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)[:2]
    return out, lse.reshape(q.shape[0], q.shape[1], -1)[..., : q.shape[2]].float()


def merge_parts(first: tuple[torch.Tensor, torch.Tensor], second: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Softmax over the union of two parts' keys from each part's output and
    log-sum-exp, float32. A row with no keys in a part has a log-sum-exp of
    -inf there (weight 0)."""
    (out_a, lse_a), (out_b, lse_b) = first, second
    top = torch.maximum(lse_a, lse_b)
    weight_a = torch.exp(lse_a - top).unsqueeze(-1)
    weight_b = torch.exp(lse_b - top).unsqueeze(-1)
    merged = out_a.float().mul_(weight_a).add_(out_b.float().mul_(weight_b))
    return merged.div_(weight_a + weight_b)
