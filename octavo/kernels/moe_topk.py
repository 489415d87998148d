"""The MoE router's softmax, top-k and renormalisation in one launch.

``topk_softmax(router_logits, top_k, renormalize)`` implements the
``moe_topk_softmax`` layer op (reference in ``octavo.ops.reference``): a float32 softmax over
the experts, the ``top_k`` largest probabilities (largest first, as
``torch.topk``) and their expert ids, divided by their sum if asked. One
program per token ranks the experts by their logits (ties: the lowest
index; ``route_token``). At decode this replaces five small launches per MoE layer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo.kernels.pdl import pdl_enabled, pdl_release, pdl_wait


# Experts compared with the token's others at a time when ranking them:
# [RANK_CHUNK, E_PAD] comparisons a step (32 values a thread at 4 warps).
RANK_CHUNK = tl.constexpr(32)


@triton.jit
def route_token(
    logits_ptr, num_experts, E_PAD: tl.constexpr, TOP_K: tl.constexpr, K_PAD: tl.constexpr, RENORMALIZE: tl.constexpr,
):
    """One token's routing from its row of logits: (expert ids int32
    ``[K_PAD]``, weights float32 ``[K_PAD]``), the ``TOP_K`` largest softmax
    probabilities largest first, past ``TOP_K`` id -1 and weight 0.

    The order is the logits' (the softmax keeps it), ties to the lowest
    index: each expert's rank is the number of experts before it, counted
    against the row read again in chunks (a broadcast load from L1, no
    change of layout), and the ``j``-th pick is the expert of rank ``j``.
    That is a few cross-warp reductions where picking the maximum ``k``
    times took two each (43 barriers in the top-k kernel's sm_90 code
    before, 11 now). Every kernel that routes (this module's, and the
    decode form's that route in-kernel: ``moe_routed.py``) calls this one
    function: they pick the same experts (ranks are counts, exact), and
    their weights differ at most by the order of a float32 sum over the
    experts (kernels of other warp counts reduce in other orders)."""
    experts = tl.arange(0, E_PAD)
    valid = experts < num_experts
    logits = tl.load(logits_ptr + experts, mask=valid, other=float("-inf")).to(tl.float32)
    rank = tl.zeros([E_PAD], tl.int32)
    for first in tl.static_range(0, E_PAD, RANK_CHUNK):
        others = first + tl.arange(0, RANK_CHUNK)
        other = tl.load(logits_ptr + others, mask=others < num_experts, other=float("-inf")).to(tl.float32)
        ahead = (other[:, None] > logits[None, :]) | ((other[:, None] == logits[None, :]) & (others[:, None] < experts[None, :]))
        rank += tl.sum(ahead.to(tl.int32), axis=0)
    choice = tl.arange(0, K_PAD)
    hit = (rank[None, :] == choice[:, None]) & valid[None, :] & (choice < TOP_K)[:, None]
    ids = tl.sum(tl.where(hit, experts[None, :], 0), axis=1)
    ids = tl.where(choice < TOP_K, ids, -1).to(tl.int32)
    exp = tl.where(valid, tl.exp(logits - tl.max(logits, axis=0)), 0.0)
    probs = exp / tl.sum(exp, axis=0)
    weights = tl.sum(tl.where(hit, probs[None, :], 0.0), axis=1)
    if RENORMALIZE:
        weights = weights / tl.sum(weights, axis=0)
    return ids, weights


@triton.jit
def _topk_softmax_kernel(
    logits_ptr, weights_ptr, ids_ptr, num_experts, stride_lt,
    TOP_K: tl.constexpr, K_PAD: tl.constexpr, E_PAD: tl.constexpr, RENORMALIZE: tl.constexpr, PDL: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    pdl_wait(PDL)  # the router's logits come from the GEMV before
    pdl_release(PDL)  # a program a token: the experts' kernel may be placed meanwhile
    ids, weights = route_token(logits_ptr + token * stride_lt, num_experts, E_PAD, TOP_K, K_PAD, RENORMALIZE)
    choice = tl.arange(0, K_PAD)
    tl.store(ids_ptr + token * TOP_K + choice, ids, mask=choice < TOP_K)
    tl.store(weights_ptr + token * TOP_K + choice, weights, mask=choice < TOP_K)


def experts_pad(num_experts: int) -> int:
    """The ``E_PAD`` of ``route_token`` for ``num_experts``."""
    return max(16, triton.next_power_of_2(num_experts))


def topk_softmax(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights float32 [T, k], expert ids int32 [T, k]): softmax over the
    experts, the ``top_k`` largest (descending), divided by their sum if
    ``renormalize``. One program per token."""
    num_tokens, num_experts = router_logits.shape
    weights = torch.empty((num_tokens, top_k), dtype=torch.float32, device=router_logits.device)
    ids = torch.empty((num_tokens, top_k), dtype=torch.int32, device=router_logits.device)
    if num_tokens == 0:
        return weights, ids
    if router_logits.stride(-1) != 1:
        router_logits = router_logits.contiguous()
    pdl = pdl_enabled(router_logits.device, num_tokens)
    _topk_softmax_kernel[(num_tokens,)](
        router_logits, weights, ids, num_experts, router_logits.stride(0),
        TOP_K=top_k, K_PAD=triton.next_power_of_2(top_k), E_PAD=experts_pad(num_experts), RENORMALIZE=renormalize,
        PDL=pdl,
        num_warps=4, launch_pdl=pdl,
    )
    return weights, ids
