"""Fused mixture-of-experts: every expert's SwiGLU MLP in two grouped GEMMs.

``fused_moe(x, w13, w2, topk_weights, topk_ids, activation)`` computes what
the ``fused_moe`` layer op's reference defines:
``sum_k topk_weights[t, k] * down_e(act(gate_e(x_t)) * up_e(x_t))`` with
``e = topk_ids[t, k]`` and ``act`` SiLU, GELU or tanh-GELU; ids of -1
(experts on another rank) add nothing.

1. ``align_to_experts`` (``moe_align.py``): the ``T * k`` (token, choice)
   slots sorted by expert, each expert's run padded to a multiple of
   ``block_m`` with a sentinel slot, and the expert of every ``block_m``
   block; one launch up to 1,024 slots, torch's sort past that.
2. ``_gate_up_kernel``, program (block, column tile): the block's tokens
   times the gate and up rows of its expert, SiLU-and-mul fused, written to
   the slot's row of ``[T * k, I]``.
3. ``_down_kernel``: those rows times the expert's down projection, times
   the slot's routing weight, written to the slot's row of ``[T * k, H]``;
   ``sum_over_topk`` adds each token's ``k`` rows into ``[T, H]`` (one
   launch; rows of slots with id -1 were never written and are left out).

Numerics follow the reference's rounding steps (products accumulated in
float32, each linear's output rounded to the input dtype, the activation
rounded before the product, the routing weight rounded to the input dtype). The router's
softmax and top-k are one launch too (``moe_topk.py``). Tile shapes
come from ``moe_tiles`` by the average number of tokens per expert (batch
size x top-k / experts): small tiles for decode, large ones for prefill;
``OCTAVO_MOE_TILES=block_m,block_n,block_k,num_warps,num_stages``
overrides them for tuning runs, and ``OCTAVO_MOE_GROUPED_DOWN_TILES`` the
down kernel's (``moe_tiles.py``). Batches of up to ``OCTAVO_MOE_GEMV_MAX_TOKENS``
tokens take two GEMVs instead (``fused_moe_gemv.py``, off by default).
Batches of up to ``OCTAVO_MOE_DECODE_MAX_TOKENS`` (default 1) take the
decode form (``moe_decode.py``): the gate-up kernel with no alignment
launch (one block per slot at one token, each program its own block of
the alignment at a few tokens) and a down kernel that sums over ``k``
itself, two launches where the grouped path takes five.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from octavo.kernels.activation import ACT_CODES, act_then_mul
from octavo.kernels.fused_moe_gemv import fused_moe_gemv
from octavo.kernels.moe_align import IN_KERNEL_ALIGN_MAX_SLOTS, align_to_experts, block_of_alignment, max_padded_slots
from octavo.kernels.moe_decode import down_topk_sum, moe_decode_max_tokens
from octavo.kernels.moe_tiles import (
    DownTiles, MoeTiles, default_down_tiles, fit_shared_memory, grouped_down_tiles, moe_tiles,
)
from octavo.kernels.moe_topk import experts_pad, route_token
from octavo.kernels.pdl import pdl_enabled, pdl_release, pdl_wait
from octavo.kernels.triton_utils import cdiv, dot_dtype, dot_precision, next_power_of_2, shared_memory_bytes


MOE_GEMV_MAX_TOKENS_ENV = "OCTAVO_MOE_GEMV_MAX_TOKENS"


@functools.cache
def moe_gemv_max_tokens() -> int:
    """Batches of up to this many tokens take the two-GEMV decode path
    (``fused_moe_gemv.py``: no alignment, the sum over k fused) instead of
    the grouped GEMMs (``OCTAVO_MOE_GEMV_MAX_TOKENS``, default 0: off until
    benchmarks/moe_gpu.py has timed both on a GPU)."""
    value = os.environ.get(MOE_GEMV_MAX_TOKENS_ENV, "0")
    if not value.isdigit() or int(value) > 64:
        raise ValueError(f"{MOE_GEMV_MAX_TOKENS_ENV}={value!r}: expected a number of tokens from 0 (off) to 64")
    return int(value)


ACTIVATIONS = ACT_CODES


# Where a block's rows come from: the aligned arrays, one slot per block
# (``topk_ids`` read directly), the block of the alignment computed in
# the program from ``topk_ids`` (``moe_align.block_of_alignment``), or one
# slot per block of one token whose expert the program picks from the
# router's logits itself (``moe_topk.route_token``: ``moe_routed.py``).
ROWS_ALIGNED, ROWS_PER_SLOT, ROWS_IN_KERNEL, ROWS_ROUTED = 0, 1, 2, 3


@triton.jit
def _load_block_rows(
    sorted_slots_ptr, block_experts_ptr, pid_m, num_slots, BLOCK_M: tl.constexpr,
    ROWS: tl.constexpr = 0, E_PAD: tl.constexpr = 1, SLOTS_PAD: tl.constexpr = 1,
    num_experts=1, TOP_K: tl.constexpr = 1, K_PAD: tl.constexpr = 1,
):
    """(expert, the block's slots, which of them are real) of block ``pid_m``.
    With ``ROWS_PER_SLOT`` or ``ROWS_IN_KERNEL``, ``block_experts_ptr`` is the
    flat ``topk_ids`` and nothing was aligned before the launch; with
    ``ROWS_ROUTED`` it is the one token's router logits (``num_slots`` =
    ``TOP_K``, ``K_PAD`` its power of two, ``E_PAD`` the experts')."""
    if ROWS == 1:  # ROWS_PER_SLOT: block pid_m is slot pid_m alone
        expert = tl.load(block_experts_ptr + pid_m)
        slots = tl.where(tl.arange(0, BLOCK_M) == 0, pid_m, num_slots)
    elif ROWS == 3:  # ROWS_ROUTED: slot pid_m alone, its expert the pid_m-th pick
        ids, _ = route_token(block_experts_ptr, num_experts, E_PAD, TOP_K, K_PAD, False)
        expert = tl.sum(tl.where(tl.arange(0, K_PAD) == pid_m, ids, 0), axis=0)
        slots = tl.where(tl.arange(0, BLOCK_M) == 0, pid_m, num_slots)
    elif ROWS == 2:  # ROWS_IN_KERNEL
        expert, slots = block_of_alignment(block_experts_ptr, pid_m, num_slots, BLOCK_M, E_PAD, SLOTS_PAD)
    else:
        expert = tl.load(block_experts_ptr + pid_m)
        slots = tl.load(sorted_slots_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    return expert, slots, slots < num_slots


# The number of slots changes every step: not specialised on (see paged_attention).
@triton.jit(do_not_specialize=["num_slots"])
def _gate_up_kernel(
    x_ptr, w13_ptr, out_ptr, sorted_slots_ptr, block_experts_ptr,
    num_slots, top_k, inter, hidden, num_experts,
    stride_xt, stride_we, stride_wn, stride_ot,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ACT: tl.constexpr,
    DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    ROWS: tl.constexpr = 0, E_PAD: tl.constexpr = 1, SLOTS_PAD: tl.constexpr = 1, PDL: tl.constexpr = False,
    TOP_K: tl.constexpr = 1, K_PAD: tl.constexpr = 1,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pdl_wait(PDL)  # the router's choice and the hidden state come from the kernels before
    expert, slots, real = _load_block_rows(
        sorted_slots_ptr, block_experts_ptr, pid_m, num_slots, BLOCK_M, ROWS, E_PAD, SLOTS_PAD, num_experts, TOP_K, K_PAD
    )
    if expert < 0:
        return
    tokens = (slots // top_k).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < inter
    ks = tl.arange(0, BLOCK_K)
    w_base = w13_ptr + expert.to(tl.int64) * stride_we
    acc_gate = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        k_ok = k0 + ks < hidden
        a = tl.load(x_ptr + tokens[:, None] * stride_xt + (k0 + ks)[None, :], mask=real[:, None] & k_ok[None, :], other=0.0)
        w_ptrs = w_base + cols[None, :] * stride_wn + (k0 + ks)[:, None]
        w_mask = k_ok[:, None] & col_ok[None, :]
        gate = tl.load(w_ptrs, mask=w_mask, other=0.0)
        up = tl.load(w_ptrs + inter * stride_wn, mask=w_mask, other=0.0)
        a = a.to(DOT_DTYPE)
        acc_gate = tl.dot(a, gate.to(DOT_DTYPE), acc_gate, input_precision=PRECISION)
        acc_up = tl.dot(a, up.to(DOT_DTYPE), acc_up, input_precision=PRECISION)
    pdl_release(PDL)
    dtype = out_ptr.dtype.element_ty
    out = act_then_mul(acc_gate.to(dtype).to(tl.float32), acc_up.to(dtype).to(tl.float32), ACT, dtype)
    out_ptrs = out_ptr + slots.to(tl.int64)[:, None] * stride_ot + cols[None, :]
    tl.store(out_ptrs, out.to(dtype), mask=real[:, None] & col_ok[None, :])


@triton.jit(do_not_specialize=["num_slots"])
def _down_kernel(
    x_ptr, w2_ptr, out_ptr, weights_ptr, sorted_slots_ptr, block_experts_ptr,
    num_slots, hidden, inter,
    stride_xt, stride_we, stride_wn, stride_ot,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert, slots, real = _load_block_rows(sorted_slots_ptr, block_experts_ptr, pid_m, num_slots, BLOCK_M)
    if expert < 0:
        return
    rows = slots.to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < hidden
    ks = tl.arange(0, BLOCK_K)
    w_base = w2_ptr + expert.to(tl.int64) * stride_we
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, inter, BLOCK_K):
        k_ok = k0 + ks < inter
        a = tl.load(x_ptr + rows[:, None] * stride_xt + (k0 + ks)[None, :], mask=real[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_base + cols[None, :] * stride_wn + (k0 + ks)[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc = tl.dot(a.to(DOT_DTYPE), w.to(DOT_DTYPE), acc, input_precision=PRECISION)
    dtype = out_ptr.dtype.element_ty
    weight = tl.load(weights_ptr + rows, mask=real, other=0.0).to(dtype).to(tl.float32)
    out = acc.to(dtype).to(tl.float32) * weight[:, None]
    tl.store(out_ptr + rows[:, None] * stride_ot + cols[None, :], out.to(dtype), mask=real[:, None] & col_ok[None, :])


def _options(tiles: MoeTiles, dtype: torch.dtype) -> dict:
    return dict(
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
        DOT_DTYPE=dot_dtype(dtype), PRECISION=dot_precision(dtype),
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )


def gate_up(
    hidden: torch.Tensor, w13: torch.Tensor, sorted_slots: torch.Tensor, block_experts: torch.Tensor,
    num_blocks: int, top_k: int, act_code: int, tiles: MoeTiles, rows: int = ROWS_ALIGNED, pdl: bool = False,
) -> torch.Tensor:
    """``[T * k, I]``: each slot's ``act(gate) * up`` (rows of -1 slots unwritten).
    ``pdl``: launched as a link of the decode chain (``pdl.py``); with
    ``ROWS_ROUTED``, ``block_experts`` is the one token's router logits."""
    num_slots, (num_experts, two_inter) = hidden.shape[0] * top_k, w13.shape[:2]
    inter = two_inter // 2
    act = torch.empty((num_slots, inter), dtype=hidden.dtype, device=hidden.device)
    pads = {}
    if rows == ROWS_IN_KERNEL:
        pads = dict(E_PAD=experts_pad(num_experts), SLOTS_PAD=max(16, next_power_of_2(num_slots)))
    elif rows == ROWS_ROUTED:
        pads = dict(E_PAD=experts_pad(num_experts), TOP_K=top_k, K_PAD=next_power_of_2(top_k))
    _gate_up_kernel[(num_blocks, cdiv(inter, tiles.block_n))](
        hidden, w13, act, sorted_slots, block_experts,
        num_slots, top_k, inter, hidden.shape[1], num_experts,
        hidden.stride(0), w13.stride(0), w13.stride(1), act.stride(0),
        ACT=act_code, ROWS=rows, **pads, **_options(tiles, hidden.dtype), PDL=pdl, launch_pdl=pdl,
    )
    return act


def _grouped(
    hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
    act_code: int, tiles: MoeTiles, down_tiles: DownTiles | None = None,
) -> torch.Tensor:
    """Aligned slots, the grouped gate-up and down GEMMs, then the sum over k."""
    top_k, hidden_size = topk_ids.shape[1], hidden.shape[1]
    align = align_to_experts(topk_ids, w13.shape[0], tiles.block_m)
    num_blocks = align.block_experts.shape[0]
    act = gate_up(hidden, w13, align.sorted_slots, align.block_experts, num_blocks, top_k, act_code, tiles)
    num_slots = act.shape[0]
    # Rows of skipped experts' slots are never written: the sum leaves them out.
    per_slot = torch.empty((num_slots, hidden_size), dtype=hidden.dtype, device=hidden.device)
    weights = topk_weights.reshape(-1).to(torch.float32).contiguous()
    element_size = max(hidden.element_size(), w2.element_size())
    default = default_down_tiles(tiles, w2.shape[2], shared_memory_bytes(hidden.device), element_size)
    down = grouped_down_tiles(tiles, down_tiles, default)
    _down_kernel[(num_blocks, cdiv(hidden_size, down.block_n))](
        act, w2, per_slot, weights, align.sorted_slots, align.block_experts,
        num_slots, hidden_size, act.shape[1],
        act.stride(0), w2.stride(0), w2.stride(1), per_slot.stride(0), **_options(down, hidden.dtype),
    )
    return sum_over_topk(per_slot, topk_ids)


_SUM_BLOCK = 1024


@triton.jit
def _sum_over_topk_kernel(per_slot_ptr, ids_ptr, out_ptr, hidden, TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    """Program (token, column block): the sum of the token's slot rows whose
    expert is here (id >= 0), in float32, rounded once (as torch's sum)."""
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    col_ok = cols < hidden
    acc = tl.zeros([BLOCK], tl.float32)
    for j in tl.static_range(TOP_K):
        slot = token * TOP_K + j
        here = col_ok & (tl.load(ids_ptr + slot + tl.zeros([BLOCK], tl.int64)) >= 0)  # the slot's id, per lane
        acc += tl.load(per_slot_ptr + slot * hidden + cols, mask=here, other=0.0).to(tl.float32)
    tl.store(out_ptr + token * hidden + cols, acc.to(out_ptr.dtype.element_ty), mask=col_ok)


def sum_over_topk(per_slot: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """``[T, H]``: each token's ``k`` rows of ``per_slot`` (``[T * k, H]``, contiguous)
    summed, rows of slots with id -1 (unwritten) left out; one launch where a
    zero fill before the down kernel and torch's sum took two."""
    (num_tokens, top_k), hidden_size = topk_ids.shape, per_slot.shape[1]
    out = torch.empty((num_tokens, hidden_size), dtype=per_slot.dtype, device=per_slot.device)
    block = min(_SUM_BLOCK, next_power_of_2(hidden_size))
    _sum_over_topk_kernel[(num_tokens, cdiv(hidden_size, block))](
        per_slot, topk_ids.reshape(-1).contiguous(), out, hidden_size, TOP_K=top_k, BLOCK=block, num_warps=4,
    )
    return out


def _decode(
    hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
    act_code: int, tiles: MoeTiles,
) -> torch.Tensor:
    """Two launches (``moe_decode.py``): the gate-up GEMM, its blocks one per
    slot at one token (the k experts are distinct) or its own block of the
    alignment at a few tokens (experts the tokens share read once), then
    the down kernel summing over k."""
    (num_tokens, top_k), num_slots = topk_ids.shape, topk_ids.numel()
    ids = topk_ids.reshape(-1).to(torch.int32).contiguous()
    # Between the router's top-k and the down kernel, both links of the
    # decode chain: without PDL here the chain broke twice a MoE layer.
    pdl = pdl_enabled(hidden.device, num_tokens)
    if num_tokens == 1:
        act = gate_up(hidden, w13, ids, ids, num_slots, top_k, act_code, tiles, ROWS_PER_SLOT, pdl)
    elif num_slots <= IN_KERNEL_ALIGN_MAX_SLOTS:
        num_blocks = max_padded_slots(num_slots, w13.shape[0], tiles.block_m) // tiles.block_m
        act = gate_up(hidden, w13, ids, ids, num_blocks, top_k, act_code, tiles, ROWS_IN_KERNEL, pdl)
    else:
        align = align_to_experts(topk_ids, w13.shape[0], tiles.block_m)
        num_blocks = align.block_experts.shape[0]
        act = gate_up(hidden, w13, align.sorted_slots, align.block_experts, num_blocks, top_k, act_code, tiles)
    return down_topk_sum(act, w2, topk_weights, ids.view(topk_ids.shape))


def checked_inputs(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, activation: str) -> tuple[torch.Tensor, int]:
    """``hidden`` with a contiguous last dimension and the activation's code; ValueError for what the kernels cannot take."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"fused_moe activation {activation!r} is not one of {', '.join(ACTIVATIONS)}")
    if w13.stride(-1) != 1 or w2.stride(-1) != 1:
        raise ValueError("fused_moe: expert weights must be contiguous along their last dimension")
    return (hidden if hidden.stride(-1) == 1 else hidden.contiguous()), ACTIVATIONS[activation]


def fused_moe(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
    tiles: MoeTiles | None = None,
    decode: bool | None = None,
    down_tiles: DownTiles | None = None,
) -> torch.Tensor:
    """hidden [T, H]; w13 [E, 2I, H]; w2 [E, H, I]; topk_weights [T, k]
    (float32); topk_ids [T, k] (-1 = skip); activation silu, gelu or
    gelu_tanh. Returns [T, H] in ``hidden``'s dtype. ``tiles``,
    ``decode`` (the decode form or the grouped GEMMs; None: by the number
    of tokens) and ``down_tiles`` (the grouped down kernel's) are for tests
    and tuning runs."""
    hidden, act_code = checked_inputs(hidden, w13, w2, activation)
    num_tokens, hidden_size = hidden.shape
    if num_tokens == 0:
        return torch.zeros((0, hidden_size), dtype=hidden.dtype, device=hidden.device)
    if tiles is None and decode is None and num_tokens <= moe_gemv_max_tokens():
        return fused_moe_gemv(hidden, w13, w2, topk_weights, topk_ids, act_code)
    tiles = tiles or moe_tiles(num_tokens, topk_ids.shape[1], w13.shape[0])
    if decode is None:
        decode = num_tokens <= moe_decode_max_tokens()
    if decode:
        return _decode(hidden, w13, w2, topk_weights, topk_ids, act_code, tiles)
    tiles = fit_shared_memory(tiles, max(hidden.element_size(), w13.element_size()))
    return _grouped(hidden, w13, w2, topk_weights, topk_ids, act_code, tiles, down_tiles)
