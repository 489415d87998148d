"""Fused mixture-of-experts for a handful of tokens (decode): two GEMVs.

At decode a step routes 1-4 tokens to ``top_k`` experts each, and the
grouped-GEMM path (``fused_moe.py``) spends most of its time around the
GEMMs: an alignment launch, blocks of ``block_m`` rows holding one real
row, and a sum over ``k``. Here no slot is sorted:

1. ``_gate_up_gemv_kernel``, program (slot, column tile): the slot's expert
   read from ``topk_ids``, its gate and up rows times the token's hidden
   state, the activation-and-mul fused, written to the slot's row of
   ``[T * k, I]``.
2. ``_down_gemv_kernel``, program (token, column tile): for each of the
   token's ``k`` slots, the slot's row times its expert's down rows, times
   the routing weight, summed over ``k`` in registers: ``[T, H]`` directly.

Rounding follows the reference step for step (each linear's output and the
activation rounded to the input dtype, the routing weight rounded to it,
each slot's product rounded, the sum over ``k`` in float32 rounded once, as
torch's sum of that dtype). Slots of -1 (experts on another rank) add
nothing. Weights are read once per step: each program streams its rows of
one expert (gate-up) or of ``k`` experts (down) along the contiguous input
dimension. ``OCTAVO_MOE_GEMV_TILES=block_n,block_k,num_warps`` overrides the
tiles of both kernels for tuning runs, six numbers those of each
(benchmarks/moe_gpu.py): the down GEMV runs one program per token and
column tile, so at one token its ``block_n`` alone sets how many programs
stream the experts' down rows (256 at Qwen3-30B-A3B's width with 8).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from octavo.kernels.activation import act_then_mul
from octavo.kernels.pdl import pdl_enabled, pdl_release, pdl_wait
from octavo.kernels.triton_utils import cdiv, ints_from_env

MOE_GEMV_TILES_ENV = "OCTAVO_MOE_GEMV_TILES"
# (block_n, block_k, num_warps) of the gate-up GEMV, then of the down GEMV:
# a starting point (round 25: slower than the grouped path), to be swept on the GPU.
DEFAULT_TILES = (8, 256, 4, 8, 256, 4)


@functools.cache
def moe_gemv_tiles() -> tuple[int, ...]:
    """Six tile numbers: the gate-up GEMV's (block_n, block_k, num_warps), then the down GEMV's."""
    parts = ints_from_env(
        MOE_GEMV_TILES_ENV, "block_n,block_k,num_warps (both GEMVs) or six numbers (gate-up, then down)", (3, 6)
    )
    return DEFAULT_TILES if parts is None else both_tiles(parts)


def both_tiles(tiles: tuple[int, ...]) -> tuple[int, ...]:
    """Three tile numbers stand for both GEMVs; six are the gate-up's then the down's."""
    return tuple(tiles) * 2 if len(tiles) == 3 else tuple(tiles)


@triton.jit
def _row_times_tile(x_row_ptr, w_ptrs, col_ok, length, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    EVEN_K: tl.constexpr):
    """sum_k x[k] * w[n, k] in float32 for the tile's ``BLOCK_N`` rows ``w_ptrs`` (at k = 0).

    ``x`` is read per weight row (from L1) as a ``[BLOCK_N, BLOCK_K]`` tile,
    the weights' shape, so that it takes their layout, and the products are
    summed along K once at the end: no layout change or cross-warp
    reduction through shared memory per K step (4 barriers a step before;
    tests/kernels/sass_loops.py). ``EVEN_K`` (``BLOCK_K`` divides the
    length): no mask along K, which would keep the loads scalar."""
    ks = tl.arange(0, BLOCK_K)[None, :]
    x_rows = x_row_ptr + tl.zeros([BLOCK_N, 1], tl.int32)
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k0 in range(0, length, BLOCK_K):
        k_ok = (k0 + ks < length) | EVEN_K
        x = tl.load(x_rows + k0 + ks, mask=k_ok, other=0.0).to(tl.float32)
        w = tl.load(w_ptrs + k0 + ks, mask=col_ok[:, None] & k_ok, other=0.0).to(tl.float32)
        acc += w * x
    return tl.sum(acc, axis=1)


@triton.jit(do_not_specialize=["num_slots"])
def _gate_up_gemv_kernel(
    x_ptr, w13_ptr, out_ptr, ids_ptr,
    num_slots, top_k, inter, hidden,
    stride_xt, stride_we, stride_wn, stride_ot,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ACT: tl.constexpr, EVEN_K: tl.constexpr, PDL: tl.constexpr,
):
    slot = tl.program_id(0)
    pdl_wait(PDL)  # the router's choice and the hidden state come from the kernels before
    expert = tl.load(ids_ptr + slot)
    if expert < 0:
        return
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < inter
    x_row = x_ptr + (slot // top_k).to(tl.int64) * stride_xt
    w_rows = w13_ptr + expert.to(tl.int64) * stride_we + cols[:, None].to(tl.int64) * stride_wn
    gate = _row_times_tile(x_row, w_rows, col_ok, hidden, BLOCK_N, BLOCK_K, EVEN_K)
    up = _row_times_tile(x_row, w_rows + inter * stride_wn, col_ok, hidden, BLOCK_N, BLOCK_K, EVEN_K)
    pdl_release(PDL)
    dtype = out_ptr.dtype.element_ty
    out = act_then_mul(gate.to(dtype).to(tl.float32), up.to(dtype).to(tl.float32), ACT, dtype)
    tl.store(out_ptr + slot.to(tl.int64) * stride_ot + cols, out.to(dtype), mask=col_ok)


@triton.jit
def _down_gemv_kernel(
    act_ptr, w2_ptr, out_ptr, weights_ptr, ids_ptr,
    top_k, hidden, inter,
    stride_at, stride_we, stride_wn, stride_ot,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, PDL: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < hidden
    dtype = out_ptr.dtype.element_ty
    total = tl.zeros([BLOCK_N], tl.float32)
    pdl_wait(PDL)
    for j in range(0, top_k):
        slot = token * top_k + j
        expert = tl.load(ids_ptr + slot)
        if expert >= 0:
            w_rows = w2_ptr + expert.to(tl.int64) * stride_we + cols[:, None].to(tl.int64) * stride_wn
            acc = _row_times_tile(act_ptr + slot * stride_at, w_rows, col_ok, inter, BLOCK_N, BLOCK_K, EVEN_K)
            weight = tl.load(weights_ptr + slot).to(dtype).to(tl.float32)
            total += (acc.to(dtype).to(tl.float32) * weight).to(dtype).to(tl.float32)
    pdl_release(PDL)
    tl.store(out_ptr + token * stride_ot + cols, total.to(dtype), mask=col_ok)


def fused_moe_gemv(
    hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
    topk_weights: torch.Tensor, topk_ids: torch.Tensor, act_code: int, tiles: tuple[int, ...] | None = None,
) -> torch.Tensor:
    """``fused_moe`` for a few tokens (same arguments; ``act_code`` as
    ``fused_moe.ACTIVATIONS`` maps them; ``tiles`` as ``moe_gemv_tiles``
    gives them, three or six numbers, for tuning runs). Inputs already
    checked there."""
    num_tokens, hidden_size = hidden.shape
    inter, top_k = w13.shape[1] // 2, topk_ids.shape[1]
    block_n, block_k, num_warps, down_n, down_k, down_warps = both_tiles(tiles) if tiles else moe_gemv_tiles()
    ids = topk_ids.reshape(-1).to(torch.int32).contiguous()
    num_slots = ids.numel()
    pdl = pdl_enabled(hidden.device, num_tokens)
    act = torch.empty((num_slots, inter), dtype=hidden.dtype, device=hidden.device)
    _gate_up_gemv_kernel[(num_slots, cdiv(inter, block_n))](
        hidden, w13, act, ids, num_slots, top_k, inter, hidden_size,
        hidden.stride(0), w13.stride(0), w13.stride(1), act.stride(0),
        BLOCK_N=block_n, BLOCK_K=block_k, ACT=act_code, EVEN_K=hidden_size % block_k == 0, PDL=pdl,
        num_warps=num_warps, launch_pdl=pdl,
    )
    out = torch.empty((num_tokens, hidden_size), dtype=hidden.dtype, device=hidden.device)
    weights = topk_weights.reshape(-1).to(torch.float32).contiguous()
    _down_gemv_kernel[(num_tokens, cdiv(hidden_size, down_n))](
        act, w2, out, weights, ids, top_k, hidden_size, inter,
        act.stride(0), w2.stride(0), w2.stride(1), out.stride(0),
        BLOCK_N=down_n, BLOCK_K=down_k, EVEN_K=inter % down_k == 0, PDL=pdl, num_warps=down_warps, launch_pdl=pdl,
    )
    return out
