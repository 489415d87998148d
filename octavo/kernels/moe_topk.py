"""The MoE router's softmax, top-k and renormalisation in one launch.

``topk_softmax(router_logits, top_k, renormalize)`` implements the
``moe_topk_softmax`` layer op (reference in ``octavo.ops.reference``): a float32 softmax over
the experts, the ``top_k`` largest probabilities (largest first, as
``torch.topk``) and their expert ids, divided by their sum if asked. One
program per token picks the maximum ``top_k`` times (ties: the lowest
index). At decode this replaces five small launches per MoE layer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo.kernels.pdl import pdl_enabled, pdl_release, pdl_wait


@triton.jit
def _topk_softmax_kernel(
    logits_ptr, weights_ptr, ids_ptr, num_experts, stride_lt,
    TOP_K: tl.constexpr, E_PAD: tl.constexpr, RENORMALIZE: tl.constexpr, PDL: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    pdl_wait(PDL)  # the router's logits come from the GEMV before
    pdl_release(PDL)  # a program a token: the experts' kernel may be placed meanwhile
    experts = tl.arange(0, E_PAD)
    logits = tl.load(logits_ptr + token * stride_lt + experts, mask=experts < num_experts, other=float("-inf"))
    logits = logits.to(tl.float32)
    exp = tl.exp(logits - tl.max(logits, axis=0))
    probs = exp / tl.sum(exp, axis=0)
    # Pick the top k twice (argmax k times, the same sequence both times):
    # first for their sum, then to write ids and weights, largest first as
    # torch.topk orders them.
    picked = tl.zeros([E_PAD], tl.int1)
    total = 0.0
    for _ in tl.static_range(TOP_K):
        best = tl.argmax(tl.where(picked, -1.0, probs), axis=0)
        picked = picked | (experts == best)
        total += tl.sum(tl.where(experts == best, probs, 0.0), axis=0)
    picked = tl.zeros([E_PAD], tl.int1)
    for j in tl.static_range(TOP_K):
        best = tl.argmax(tl.where(picked, -1.0, probs), axis=0)
        picked = picked | (experts == best)
        weight = tl.sum(tl.where(experts == best, probs, 0.0), axis=0)
        if RENORMALIZE:
            weight = weight / total
        tl.store(ids_ptr + token * TOP_K + j, best.to(tl.int32))
        tl.store(weights_ptr + token * TOP_K + j, weight)


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
        TOP_K=top_k, E_PAD=max(16, triton.next_power_of_2(num_experts)), RENORMALIZE=renormalize, PDL=pdl,
        num_warps=4, launch_pdl=pdl,
    )
    return weights, ids
