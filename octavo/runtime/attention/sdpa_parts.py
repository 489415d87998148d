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
log-sum-exps in one kernel (``kernels/attention_merge.py``), as split-KV
decode merges its splits.

The fused kernels that return a log-sum-exp are ATen's own ops, not public
API: cuDNN's (then FlashAttention-2's) on CUDA, the CPU flash kernel on the
CPU. cuDNN's is first given the grouped KV heads as they are; where it
refuses them (and for the others) the KV heads are repeated.
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
    q: torch.Tensor,
    context: tuple[torch.Tensor, torch.Tensor],
    own: tuple[torch.Tensor, torch.Tensor],
    scale: float,
    out: torch.Tensor,
) -> torch.Tensor:
    """Queries that follow ``context`` (keys, values) and attend causally over
    ``own``, merged into ``out`` [Q, H, D] (``kernels/attention_merge.py``)."""
    from octavo.kernels.attention_merge import merge_attention_parts

    whole = attention_with_lse(q, *context, scale, causal=False)
    causal = attention_with_lse(q, *own, scale, causal=True)
    return merge_attention_parts((whole[0][0], whole[1][0]), (causal[0][0], causal[1][0]), out)


# Whether cuDNN's op took grouped KV heads (fewer than the query's) as they are,
# per device type; None until the first call tells.
_CUDNN_TAKES_GROUPED_HEADS: dict[str, bool] = {}


def attention_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [1, H, Q, D], natural log-sum-exp of each row's scores [1, H, Q] float32)."""
    aten = torch.ops.aten
    device = q.device.type
    if device == "cpu":
        k, v = _repeat_heads(q, k, v)
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
        return out, _rows(lse, q)
    if k.shape[1] != q.shape[1] and _CUDNN_TAKES_GROUPED_HEADS.get(device, True):
        try:
            result = _cudnn_with_lse(q, k, v, scale, causal)
            _CUDNN_TAKES_GROUPED_HEADS[device] = True
            return result
        except RuntimeError:
            _CUDNN_TAKES_GROUPED_HEADS[device] = False
    k, v = _repeat_heads(q, k, v)
    try:
        return _cudnn_with_lse(q, k, v, scale, causal)
    except RuntimeError:  # cuDNN without attention, or not for these shapes
        out, lse = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)[:2]
        return out, _rows(lse, q)


def _cudnn_with_lse(q, k, v, scale: float, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    cudnn = torch.ops.aten._scaled_dot_product_cudnn_attention
    out, lse = cudnn(q, k, v, None, True, 0.0, causal, False, scale=scale)[:2]
    return out, _rows(lse, q)


def _repeat_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    groups = q.shape[1] // k.shape[1]
    if groups == 1:
        return k, v
    return k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)


def _rows(lse: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """A kernel's log-sum-exp as [1, H, Q] float32 (some pad Q, or add a trailing 1)."""
    return lse.reshape(q.shape[0], q.shape[1], -1)[..., : q.shape[2]].float()
