"""The router's top-k and the experts in one op: ``fused_moe_routed``.

A MoE layer's decode chain had three kernels after the router's logits:
``moe_topk_softmax`` (one program: a softmax over the experts and ``k``
argmaxes, 3.8 us a layer on the H200 in round 30's profile of
Qwen3-30B-A3B, 6% of its step), then the experts' gate-up and down
kernels reading its ids and weights. At one token the decode form
(``moe_decode.py``) needs no alignment, so each program of both experts'
kernels can pick for itself: gate-up block ``j`` is slot ``j``, whose
expert is the ``j``-th pick (``fused_moe.ROWS_ROUTED``); each down program
picks all ``k`` with their weights. Both call ``moe_topk.route_token``,
the function the top-k kernel calls: the three pick the same experts, and
the weights differ at most by the order of a float32 sum (the kernels'
warp counts differ). The logits are 128 floats (Qwen3-MoE) read from L2
by every program: far less than one weight tile. The pick ranks the
experts with a few reductions (``route_token``), a fraction of what
``k`` argmaxes cost.

Measured on the H200 (round 35), the pick in every program costs more than
the launch it saves: Qwen3-30B-A3B's MoE block at one token 43.6 us routed
in the kernels against 40.0 with the top-k launch, batch-1 decode 2.90
against 2.72 ms a token. So it is off unless ``OCTAVO_MOE_ROUTED=1``: one
token then takes the top-k kernel and ``fused_moe``, as batches of more
than one token always do (what the op's composition does on platforms
without it).
"""

from __future__ import annotations

import functools

import torch

from octavo.env_switches import switch_from_env
from octavo.kernels.fused_moe import ROWS_ROUTED, checked_inputs, gate_up, fused_moe, moe_tiles
from octavo.kernels.moe_decode import down_routed, moe_decode_max_tokens
from octavo.kernels.moe_topk import topk_softmax
from octavo.kernels.pdl import pdl_enabled

MOE_ROUTED_ENV = "OCTAVO_MOE_ROUTED"


@functools.cache
def routes_in_kernel() -> bool:
    """Whether one-token MoE layers pick their experts inside the experts' kernels
    (``OCTAVO_MOE_ROUTED=1``). Off by default: on the H200 (round 35) the pick
    in every program of both kernels cost more than the launch it saves
    (Qwen3-30B-A3B's MoE block at one token 43.6 us against 40.0; batch-1
    decode 2.90 against 2.72 ms a token)."""
    return switch_from_env(MOE_ROUTED_ENV, default=False) and moe_decode_max_tokens() >= 1


def fused_moe_routed(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    router_logits: torch.Tensor,
    top_k: int,
    renormalize: bool,
    activation: str = "silu",
) -> torch.Tensor:
    """``fused_moe`` of ``moe_topk_softmax(router_logits, top_k, renormalize)``:
    hidden ``[T, H]``, w13 ``[E, 2I, H]``, w2 ``[E, H, I]``, router_logits
    ``[T, E]``. Returns ``[T, H]`` in ``hidden``'s dtype."""
    num_tokens = hidden.shape[0]
    if num_tokens != 1 or not routes_in_kernel():
        weights, ids = topk_softmax(router_logits, top_k, renormalize)
        return fused_moe(hidden, w13, w2, weights, ids, activation)
    hidden, act_code = checked_inputs(hidden, w13, w2, activation)
    num_experts = w13.shape[0]
    if router_logits.shape != (1, num_experts) or not 1 <= top_k <= num_experts:
        raise ValueError(f"fused_moe_routed: logits {tuple(router_logits.shape)} for {num_experts} experts, top-{top_k}")
    logits = router_logits.contiguous()
    tiles = moe_tiles(1, top_k, num_experts)
    pdl = pdl_enabled(hidden.device, 1)
    act = gate_up(hidden, w13, logits, logits, top_k, top_k, act_code, tiles, ROWS_ROUTED, pdl)
    return down_routed(act, w2, logits, top_k, renormalize)
