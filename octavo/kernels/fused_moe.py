"""Fused mixture-of-experts: every expert's SwiGLU MLP in two grouped GEMMs.

``fused_moe(x, w13, w2, topk_weights, topk_ids, activation)`` computes what
the ``fused_moe`` layer op's reference defines:
``sum_k topk_weights[t, k] * down_e(act(gate_e(x_t)) * up_e(x_t))`` with
``e = topk_ids[t, k]`` and ``act`` SiLU, GELU or tanh-GELU; ids of -1
(experts on another rank) add nothing.

1. ``align_to_experts``: the ``T * k`` (token, choice) slots sorted by
   expert, each expert's run padded to a multiple of ``block_m`` with a
   sentinel slot, and the expert of every ``block_m`` block (-1 past the
   end). Sizes are upper bounds fixed by ``T``, ``k``, ``E`` and ``block_m``
   (``T * k + E * (block_m - 1)`` sorted slots) and nothing synchronises
   with the host, so a step using it can be captured in a CUDA graph. Up to
   ``ALIGN_KERNEL_MAX_SLOTS`` slots (decode and small batches, where launch
   count is what costs) one program of ``_align_kernel`` does it all; larger
   batches use torch's sort (``align_to_experts_torch``, ~25 small ops).
2. ``_gate_up_kernel``, program (block, column tile): the block's tokens
   times the gate and up rows of its expert, SiLU-and-mul fused, written to
   the slot's row of ``[T * k, I]``.
3. ``_down_kernel``: those rows times the expert's down projection, times
   the slot's routing weight, written to the slot's row of ``[T * k, H]``;
   a sum over ``k`` gives ``[T, H]``.

Numerics follow the reference's rounding steps (products accumulated in
float32, each linear's output rounded to the input dtype, the activation
rounded before the product, the routing weight rounded to the input dtype). The router's
softmax and top-k are one launch too (``moe_topk.py``). Tile shapes
come from ``moe_tiles`` by the average number of tokens per expert (batch
size x top-k / experts): small tiles for decode, large ones for prefill;
``OCTAVO_MOE_TILES=block_m,block_n,block_k,num_warps,num_stages``
overrides them for tuning runs. Batches of up to ``OCTAVO_MOE_GEMV_MAX_TOKENS``
tokens take two GEMVs instead (``fused_moe_gemv.py``).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from octavo.kernels.activation import GELU, GELU_TANH, SILU, act_then_mul
from octavo.kernels.fused_moe_gemv import fused_moe_gemv
from octavo.kernels.triton_utils import cdiv, dot_dtype, dot_precision, ints_from_env


@dataclass(frozen=True)
class MoeTiles:
    block_m: int  # sorted slots per block (each block holds one expert's tokens)
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


# By average tokens per expert (T * k / E), smallest first. Decode (a few
# tokens per expert, memory-bound: every program streams weight tiles) takes
# the smallest block_m that tl.dot allows; prefill takes tiles that reuse
# each weight tile over many tokens. Starting points, to be tuned on the GPU
# with OCTAVO_MOE_TILES and benchmarks/moe_gpu.py.
_TILE_TABLE = (
    (16, MoeTiles(16, 64, 128, 4, 4)),
    (64, MoeTiles(32, 64, 128, 4, 3)),
    (256, MoeTiles(64, 128, 64, 8, 3)),
    (None, MoeTiles(128, 128, 64, 8, 3)),
)


@functools.cache
def _tiles_from_env() -> MoeTiles | None:
    parts = ints_from_env("OCTAVO_MOE_TILES", "block_m,block_n,block_k,num_warps,num_stages", (5,))
    return None if parts is None else MoeTiles(*parts)


def moe_tiles(num_tokens: int, top_k: int, num_experts: int) -> MoeTiles:
    """The tile shape for a batch of ``num_tokens`` routed to ``top_k`` of ``num_experts``."""
    override = _tiles_from_env()
    if override is not None:
        return override
    per_expert = num_tokens * top_k / max(num_experts, 1)
    return next(tiles for limit, tiles in _TILE_TABLE if limit is None or per_expert <= limit)


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


@dataclass
class ExpertAlignment:
    sorted_slots: torch.Tensor  # [max_padded] int32: slot t * k + j, or T * k (padding)
    block_experts: torch.Tensor  # [max_padded // block_m] int32: local expert, -1 = nothing to do


ALIGN_KERNEL_MAX_SLOTS = 1024
_ALIGN_BLOCK = 64
_ALIGN_FILL_BLOCK = 1024


def max_padded_slots(num_slots: int, num_experts: int, block_m: int) -> int:
    return cdiv(num_slots + num_experts * (block_m - 1), block_m) * block_m


@triton.jit(do_not_specialize=["num_slots", "max_padded"])
def _align_kernel(
    ids_ptr, sorted_slots_ptr, block_experts_ptr, num_slots, max_padded,
    E_PAD: tl.constexpr, BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, FILL_BLOCK: tl.constexpr,
):
    """One program: count slots per expert, place each slot (stable), then
    mark padding positions and every block's expert. The three kinds of
    position (real slots, an expert's padding, the spare tail) are disjoint,
    so their stores need no ordering; only the slot pass compares against
    every expert, the others are plain stores (decode at 128 experts pads
    to ~2,000 positions, which a per-position expert search made the
    slowest launch of the layer)."""
    experts = tl.arange(0, E_PAD)
    counts = tl.zeros([E_PAD], tl.int32)
    for start in range(0, num_slots, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ids = tl.load(ids_ptr + offs, mask=offs < num_slots, other=-1)
        counts += tl.sum((ids[:, None] == experts[None, :]).to(tl.int32), axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    total = tl.sum(padded, axis=0)
    seen = tl.zeros([E_PAD], tl.int32)
    for start in range(0, num_slots, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ids = tl.load(ids_ptr + offs, mask=offs < num_slots, other=-1)
        onehot = (ids[:, None] == experts[None, :]).to(tl.int32)
        earlier = tl.cumsum(onehot, axis=0) - onehot  # same-expert slots before this one in the chunk
        dest = tl.sum(onehot * (earlier + seen[None, :] + starts[None, :]), axis=1)
        tl.store(sorted_slots_ptr + dest, offs, mask=ids >= 0)
        seen += tl.sum(onehot, axis=0)
    # Each expert's padding: fewer than BLOCK_M positions after its slots.
    pad = starts[:, None] + counts[:, None] + tl.arange(0, BLOCK_M)[None, :]
    tl.store(sorted_slots_ptr + pad, num_slots, mask=pad < ends[:, None])
    # The spare tail past the last expert's run.
    for start in range(0, max_padded, FILL_BLOCK):
        pos = start + tl.arange(0, FILL_BLOCK)
        tl.store(sorted_slots_ptr + pos, num_slots, mask=(pos >= total) & (pos < max_padded))
    # Every block's expert: the one whose run holds the block's first position.
    for start in range(0, max_padded // BLOCK_M, BLOCK):
        blocks = start + tl.arange(0, BLOCK)
        first = blocks * BLOCK_M
        owner = tl.sum((ends[None, :] <= first[:, None]).to(tl.int32), axis=1)
        tl.store(block_experts_ptr + blocks, tl.where(first < total, owner, -1), mask=first < max_padded)


def align_to_experts(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertAlignment:
    """Slots sorted by expert, each expert's run padded to whole blocks (see module docstring)."""
    num_slots = topk_ids.numel()
    if num_slots > ALIGN_KERNEL_MAX_SLOTS:
        return align_to_experts_torch(topk_ids, num_experts, block_m)
    max_padded = max_padded_slots(num_slots, num_experts, block_m)
    sorted_slots = torch.empty(max_padded, dtype=torch.int32, device=topk_ids.device)
    block_experts = torch.empty(max_padded // block_m, dtype=torch.int32, device=topk_ids.device)
    ids = topk_ids.reshape(-1).to(torch.int32)
    _align_kernel[(1,)](
        ids, sorted_slots, block_experts, num_slots, max_padded,
        E_PAD=max(16, triton.next_power_of_2(num_experts)), BLOCK=_ALIGN_BLOCK, BLOCK_M=block_m,
        FILL_BLOCK=_ALIGN_FILL_BLOCK, num_warps=4,
    )
    return ExpertAlignment(sorted_slots, block_experts)


def align_to_experts_torch(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertAlignment:
    """``align_to_experts`` with torch ops (a sort), for batches of many slots."""
    num_slots = topk_ids.numel()
    device = topk_ids.device
    flat = topk_ids.reshape(-1).to(torch.int64)
    flat = torch.where(flat < 0, num_experts, flat)  # skipped slots: a bucket after the last expert
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    # The skipped-slot bucket takes no room. A mask, not ``padded[E] = 0``: that
    # copies a host scalar, which CUDA graph capture refuses.
    padded = padded * (torch.arange(num_experts + 1, device=device) < num_experts)
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    order = torch.argsort(flat, stable=True)
    experts = flat[order]
    rank = torch.arange(num_slots, device=device) - (torch.cumsum(counts, 0) - counts)[experts]
    max_padded = max_padded_slots(num_slots, num_experts, block_m)
    # Skipped slots land on one extra position that is cut off below.
    dest = torch.where(experts < num_experts, starts[experts] + rank, max_padded)
    sorted_slots = torch.full((max_padded + 1,), num_slots, dtype=torch.int32, device=device)
    sorted_slots.scatter_(0, dest, order.to(torch.int32))
    block_starts = torch.arange(0, max_padded, block_m, device=device)
    block_experts = torch.searchsorted(ends[:num_experts], block_starts, right=True)
    block_experts = torch.where(block_experts < num_experts, block_experts, -1).to(torch.int32)
    return ExpertAlignment(sorted_slots[:max_padded], block_experts)


ACTIVATIONS = {"silu": SILU, "gelu": GELU, "gelu_tanh": GELU_TANH}


@triton.jit
def _load_block_rows(sorted_slots_ptr, block_experts_ptr, pid_m, num_slots, BLOCK_M: tl.constexpr):
    """(expert, the block's slots, which of them are real) of block ``pid_m``."""
    expert = tl.load(block_experts_ptr + pid_m)
    slots = tl.load(sorted_slots_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    return expert, slots, slots < num_slots


# The number of slots changes every step: not specialised on (see paged_attention).
@triton.jit(do_not_specialize=["num_slots"])
def _gate_up_kernel(
    x_ptr, w13_ptr, out_ptr, sorted_slots_ptr, block_experts_ptr,
    num_slots, top_k, inter, hidden,
    stride_xt, stride_we, stride_wn, stride_ot,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ACT: tl.constexpr,
    DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert, slots, real = _load_block_rows(sorted_slots_ptr, block_experts_ptr, pid_m, num_slots, BLOCK_M)
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


def fused_moe(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
    tiles: MoeTiles | None = None,
) -> torch.Tensor:
    """hidden [T, H]; w13 [E, 2I, H]; w2 [E, H, I]; topk_weights [T, k]
    (float32); topk_ids [T, k] (-1 = skip); activation silu, gelu or
    gelu_tanh. Returns [T, H] in ``hidden``'s dtype."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"fused_moe activation {activation!r} is not one of {', '.join(ACTIVATIONS)}")
    num_tokens, hidden_size = hidden.shape
    num_experts, two_inter, _ = w13.shape
    inter, top_k = two_inter // 2, topk_ids.shape[1]
    if num_tokens == 0:
        return torch.zeros((0, hidden_size), dtype=hidden.dtype, device=hidden.device)
    if w13.stride(-1) != 1 or w2.stride(-1) != 1:
        raise ValueError("fused_moe: expert weights must be contiguous along their last dimension")
    if hidden.stride(-1) != 1:
        hidden = hidden.contiguous()
    if tiles is None and num_tokens <= moe_gemv_max_tokens():
        return fused_moe_gemv(hidden, w13, w2, topk_weights, topk_ids, ACTIVATIONS[activation])
    tiles = tiles or moe_tiles(num_tokens, top_k, num_experts)
    align = align_to_experts(topk_ids, num_experts, tiles.block_m)
    num_slots, num_blocks = topk_ids.numel(), align.block_experts.shape[0]
    common = dict(
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
        DOT_DTYPE=dot_dtype(hidden.dtype), PRECISION=dot_precision(hidden.dtype),
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )
    act = torch.empty((num_slots, inter), dtype=hidden.dtype, device=hidden.device)
    _gate_up_kernel[(num_blocks, cdiv(inter, tiles.block_n))](
        hidden, w13, act, align.sorted_slots, align.block_experts,
        num_slots, top_k, inter, hidden_size,
        hidden.stride(0), w13.stride(0), w13.stride(1), act.stride(0), ACT=ACTIVATIONS[activation], **common,
    )
    # Slots of skipped experts are never written: they must add zero.
    per_slot = torch.zeros((num_slots, hidden_size), dtype=hidden.dtype, device=hidden.device)
    weights = topk_weights.reshape(-1).to(torch.float32).contiguous()
    _down_kernel[(num_blocks, cdiv(hidden_size, tiles.block_n))](
        act, w2, per_slot, weights, align.sorted_slots, align.block_experts,
        num_slots, hidden_size, inter,
        act.stride(0), w2.stride(0), w2.stride(1), per_slot.stride(0), **common,
    )
    return per_slot.view(num_tokens, top_k, hidden_size).sum(dim=1)
