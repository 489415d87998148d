"""The fused MoE at decode: no alignment, the sum over top-k in the down kernel.

At a handful of tokens the grouped path (``fused_moe.py``) spends more
launches around its two GEMMs than in them: the expert alignment, a zero
fill of the per-slot output and a sum over ``k``. For batches of up to
``moe_decode_max_tokens`` tokens ``fused_moe`` runs instead

1. the same ``_gate_up_kernel`` without an alignment launch: at one
   token one block per slot (``ROWS_PER_SLOT``: block ``b`` holds slot
   ``b`` alone and reads its expert from ``topk_ids``; the ``k`` experts
   are distinct, so these are exactly the grouped path's busy blocks); at
   a few tokens (up to ``IN_KERNEL_ALIGN_MAX_SLOTS`` slots) each program
   computes its own block of the alignment from ``topk_ids``
   (``ROWS_IN_KERNEL``, ``moe_align.block_of_alignment``), so an expert two
   tokens share is still read once; past that, ``align_to_experts``;
2. ``_down_topk_sum_kernel``, program (token, column tile): the token's
   ``k`` slots times their experts' down rows, all ``k`` weight tiles
   loaded together (many loads in flight: the older two-GEMV path walked
   the experts one after the other and was slower, round 25), each
   slot's product rounded, times its routing weight, rounded, and the sum
   over ``k`` in float32 rounded once: what the grouped path's per-slot
   rows and ``sum_over_topk`` compute, in one launch, with no atomics. The
   order of the sum is fixed: results are deterministic.

Slots of -1 (experts on another rank) add nothing; their activation rows
are never written and never read. ``OCTAVO_MOE_DOWN_TILES=block_n,num_warps[,stages]``
overrides the down kernel's tiles (tuning runs, benchmarks/moe_gpu.py); stages
past 1 have Triton pipeline the K loop's loads through shared memory.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from octavo.kernels.moe_topk import experts_pad, route_token
from octavo.kernels.pdl import pdl_enabled, pdl_release, pdl_wait
from octavo.kernels.triton_utils import cdiv, ints_from_env, next_power_of_2

MOE_DECODE_MAX_TOKENS_ENV = "OCTAVO_MOE_DECODE_MAX_TOKENS"
MOE_DOWN_TILES_ENV = "OCTAVO_MOE_DOWN_TILES"
# Output features per program and warps of the down kernel: at Qwen3-30B-A3B's
# width (2,048) 512 programs, each with 8 experts' 4 rows (16 KB) in flight a
# step. Swept on an H100 (round 38 of benchmarks/RESULTS.md, one token, L2
# flushed): 4 warps 18.1 us, 8 warps 19.0, 2 warps 19.1; 1, 2, 8 or 16
# features a program 20.6-35.2. Batch-1 decode 3.212 -> 3.178 ms a token.
DEFAULT_DOWN_TILES = (4, 4)
# Products a program holds (top-k x block_n x block_k, float32, reduced
# along K once at the end), as the dense GEMV's deferred reduction; the K
# tile is what gives way to more experts or rows.
DOWN_PRODUCTS = 8192


@functools.cache
def moe_decode_max_tokens() -> int:
    """Batches of up to this many tokens take the decode form (this module)
    instead of the grouped GEMMs (``OCTAVO_MOE_DECODE_MAX_TOKENS``, default
    1: batch-1 decode, where the two do the same weight reads; 0 turns it
    off for A/B runs)."""
    value = os.environ.get(MOE_DECODE_MAX_TOKENS_ENV, "1")
    if not value.isdigit() or int(value) > 64:
        raise ValueError(f"{MOE_DECODE_MAX_TOKENS_ENV}={value!r}: expected a number of tokens from 0 (off) to 64")
    return int(value)


@functools.cache
def down_tiles() -> tuple[int, ...]:
    """(block_n, num_warps[, stages]) of ``_down_topk_sum_kernel``."""
    parts = ints_from_env(MOE_DOWN_TILES_ENV, "block_n,num_warps[,stages]", (2, 3))
    return DEFAULT_DOWN_TILES if parts is None else parts


@triton.jit
def _down_topk_sum_kernel(
    act_ptr, w2_ptr, out_ptr, weights_ptr, ids_ptr,
    hidden, inter, num_experts,
    stride_at, stride_we, stride_wn, stride_ot,
    TOP_K: tl.constexpr, K_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, PDL: tl.constexpr,
    ROUTED: tl.constexpr = False, E_PAD: tl.constexpr = 1, RENORMALIZE: tl.constexpr = False,
    STAGES: tl.constexpr = 1,
):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < hidden
    pdl_wait(PDL)  # the experts' activations and the router's choice come from the kernels before
    # Feature rows past the end read row 0 (stored nowhere) instead of masking every load.
    rows = tl.where(col_ok, cols, 0).to(tl.int64)
    choice = tl.arange(0, K_PAD)
    slots = token * TOP_K + choice
    if ROUTED:  # ``ids_ptr``: the token's router logits; the pick as the gate-up kernel's (moe_routed.py)
        experts, routed_weights = route_token(ids_ptr + token * num_experts, num_experts, E_PAD, TOP_K, K_PAD, RENORMALIZE)
    else:
        experts = tl.load(ids_ptr + slots, mask=choice < TOP_K, other=-1)
        routed_weights = tl.load(weights_ptr + slots, mask=experts >= 0, other=0.0)
    used = experts >= 0
    w_rows = w2_ptr + tl.where(used, experts, 0).to(tl.int64)[:, None, None] * stride_we + rows[None, :, None] * stride_wn
    # The slots' activations read per weight row (from L1): loaded in the
    # weight tile's shape, they take its layout, with no change of layout
    # through shared memory every K step (tests/kernels/sass_loops.py).
    a_rows = act_ptr + slots[:, None, None] * stride_at + tl.zeros([1, BLOCK_N, 1], tl.int64)
    ks = tl.arange(0, BLOCK_K)[None, None, :]
    acc = tl.zeros([K_PAD, BLOCK_N, BLOCK_K], tl.float32)
    # STAGES > 1: Triton pipelines the loop's loads through shared memory, STAGES - 1 steps ahead.
    for k0 in tl.range(0, inter, BLOCK_K, num_stages=STAGES):
        # A mask along K would keep the loads from being vectorised (the usual widths divide BLOCK_K).
        mask = used[:, None, None] if EVEN_K else used[:, None, None] & (k0 + ks < inter)
        a = tl.load(a_rows + k0 + ks, mask=mask, other=0.0)
        w = tl.load(w_rows + k0 + ks, mask=mask, other=0.0)
        acc += w.to(tl.float32) * a.to(tl.float32)
    pdl_release(PDL)
    dtype = out_ptr.dtype.element_ty
    # Rounding as the grouped path: each slot's product, then times its weight (rounded too).
    per_slot = tl.sum(acc, axis=2).to(dtype).to(tl.float32)
    weight = routed_weights.to(dtype).to(tl.float32)
    scaled = (per_slot * weight[:, None]).to(dtype).to(tl.float32)
    tl.store(out_ptr + token * stride_ot + cols, tl.sum(scaled, axis=0).to(dtype), mask=col_ok)


def down_topk_sum(
    act: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
    tiles: tuple[int, int] | None = None,
) -> torch.Tensor:
    """``sum_j topk_weights[t, j] * (w2[topk_ids[t, j]] @ act[t * k + j])``:
    act ``[T * k, I]`` (rows of -1 slots unread), w2 ``[E, H, I]``,
    topk_weights float32 ``[T, k]``, topk_ids int32 ``[T, k]``. Returns
    ``[T, H]`` in ``act``'s dtype; ``tiles`` (block_n, num_warps[, stages]) for tuning."""
    ids = topk_ids.reshape(-1).to(torch.int32).contiguous()
    weights = topk_weights.reshape(-1).to(torch.float32).contiguous()
    return _launch_down(act, w2, weights, ids, *topk_ids.shape, tiles, dict(ROUTED=False))


def down_routed(
    act: torch.Tensor, w2: torch.Tensor, router_logits: torch.Tensor, top_k: int, renormalize: bool,
    tiles: tuple[int, int] | None = None,
) -> torch.Tensor:
    """``down_topk_sum`` with each program routing its token from
    ``router_logits`` (``[T, E]``, contiguous) itself: the top ``top_k`` of
    the softmax, renormalised if asked (``moe_topk.route_token``: the same
    experts as ``topk_softmax`` picks, the weights up to a float32 sum's order)."""
    routed = dict(ROUTED=True, E_PAD=experts_pad(w2.shape[0]), RENORMALIZE=renormalize)
    return _launch_down(act, w2, router_logits, router_logits, router_logits.shape[0], top_k, tiles, routed)


def _launch_down(act, w2, weights, ids, num_tokens: int, top_k: int, tiles, routed: dict) -> torch.Tensor:
    hidden, inter = w2.shape[1], w2.shape[2]
    block_n, num_warps, *stages = tiles or down_tiles()
    k_pad = next_power_of_2(top_k)
    block_k = min(next_power_of_2(inter), max(16, DOWN_PRODUCTS // (k_pad * block_n)))
    out = torch.empty((num_tokens, hidden), dtype=act.dtype, device=act.device)
    pdl = pdl_enabled(act.device, num_tokens)
    _down_topk_sum_kernel[(num_tokens, cdiv(hidden, block_n))](
        act, w2, out, weights, ids, hidden, inter, w2.shape[0],
        act.stride(0), w2.stride(0), w2.stride(1), out.stride(0),
        TOP_K=top_k, K_PAD=k_pad, BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=inter % block_k == 0, PDL=pdl,
        **routed, STAGES=stages[0] if stages else 1, num_warps=num_warps, launch_pdl=pdl,
    )
    return out
