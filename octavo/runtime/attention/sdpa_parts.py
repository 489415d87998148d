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
API: cuDNN's (then FlashAttention-2's, then the memory-efficient one's) on a
GPU, the CPU flash kernel on the CPU. cuDNN's is first given the grouped KV heads as they are; where it
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


# The fused kernel that took a call, by (device type, dtype, head size, grouped KV
# heads): the first of ``_routes`` that ran without an error, found on the first call.
_ROUTE_TAKEN: dict[tuple, str] = {}


def attention_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [1, H, Q, D], natural log-sum-exp of each row's scores [1, H, Q] float32)."""
    if q.device.type == "cpu":
        k, v = _repeat_heads(q, k, v)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
        return out, _rows(lse, q)
    grouped = k.shape[1] != q.shape[1]
    key = (q.device.type, q.dtype, q.shape[-1], grouped)
    taken = _ROUTE_TAKEN.get(key)
    candidates = [taken] if taken else _routes(grouped)
    for route in candidates:
        try:
            result = _run_route(route, q, k, v, scale, causal)
        except RuntimeError:  # cuDNN without attention, or not for these shapes or grouped heads
            if route == candidates[-1]:
                raise
            continue
        _ROUTE_TAKEN[key] = route
        return result
    raise AssertionError("unreachable")


def _routes(grouped: bool) -> list[str]:
    """cuDNN's op given grouped KV heads as they are, then repeated; FlashAttention-2's,
    then the memory-efficient kernel's (any GPU torch supports) last."""
    fallbacks = ["flash_repeated", "efficient_repeated"]
    return ["cudnn", "cudnn_repeated", *fallbacks] if grouped else ["cudnn", *fallbacks]


def _run_route(route: str, q, k, v, scale: float, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if route.endswith("_repeated"):
        k, v = _repeat_heads(q, k, v)
    aten = torch.ops.aten
    if route.startswith("cudnn"):
        out, lse = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False, scale=scale)[:2]
    elif route.startswith("flash"):
        out, lse = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)[:2]
    else:
        out, lse = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal, scale=scale)[:2]
    return out, _rows(lse, q)


def _repeat_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    groups = q.shape[1] // k.shape[1]
    if groups == 1:
        return k, v
    return k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)


def _rows(lse: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """A kernel's log-sum-exp as [1, H, Q] float32 (some pad Q, or add a trailing 1)."""
    return lse.reshape(q.shape[0], q.shape[1], -1)[..., : q.shape[2]].float()
