"""Expert alignment for the grouped MoE kernels (``fused_moe.py``).

The ``T * k`` (token, choice) slots sorted by expert, each expert's run
padded to a multiple of ``block_m`` with a sentinel slot (``T * k``), and
the expert of every ``block_m`` block (-1 past the end). Sizes are upper
bounds fixed by ``T``, ``k``, ``E`` and ``block_m`` (``T * k + E *
(block_m - 1)`` sorted slots) and nothing synchronises with the host, so a
step using it can be captured in a CUDA graph. Up to
``CHUNKED_ALIGN_MAX_SLOTS`` slots (decode steps of up to hundreds of
sequences, where launch count is what costs) one launch of
``_align_kernel`` does it, a program per ``SLOTS_PER_PROGRAM`` slots, each
counting every slot (a histogram) and placing its own; larger batches
(prefill) use torch's sort (``align_to_experts_torch``, ~25 small ops). Decode
batches of ``moe_decode_max_tokens`` tokens skip it (``moe_decode.py``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from octavo.env_switches import switch_from_env
from octavo.kernels.triton_utils import cdiv


@dataclass
class ExpertAlignment:
    sorted_slots: torch.Tensor  # [max_padded] int32: slot t * k + j, or T * k (padding)
    block_experts: torch.Tensor  # [max_padded // block_m] int32: local expert, -1 = nothing to do


# One launch up to CHUNKED_ALIGN_MAX_SLOTS slots, a program per
# SLOTS_PER_PROGRAM of them (a 512-stream decode step of a 128-expert top-8
# model has 4,096: torch's sort took ~25 launches a layer there). With
# OCTAVO_MOE_CHUNKED_ALIGN=0, the earlier form: one program up to
# ALIGN_KERNEL_MAX_SLOTS, torch's sort past it.
CHUNKED_ALIGN_MAX_SLOTS = 16384
SLOTS_PER_PROGRAM = 64
ALIGN_KERNEL_MAX_SLOTS = 1024
_ALIGN_BLOCK = 64
_ALIGN_FILL_BLOCK = 1024
_ALIGN_COUNT_BLOCK = 1024  # slots a counting step (a histogram, not a comparison with every expert)


def max_padded_slots(num_slots: int, num_experts: int, block_m: int) -> int:
    return cdiv(num_slots + num_experts * (block_m - 1), block_m) * block_m


@functools.cache
def chunked_align_enabled() -> bool:
    """``OCTAVO_MOE_CHUNKED_ALIGN=0`` sends batches past one program's slots to
    torch's sort again (for A/B runs); on by default."""
    return switch_from_env("OCTAVO_MOE_CHUNKED_ALIGN")


@triton.jit(do_not_specialize=["num_slots", "max_padded", "slots_per_program", "positions_per_program"])
def _align_kernel(
    ids_ptr, sorted_slots_ptr, block_experts_ptr, num_slots, max_padded, slots_per_program, positions_per_program,
    E_PAD: tl.constexpr, BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, FILL_BLOCK: tl.constexpr,
    COUNT_BLOCK: tl.constexpr,
):
    """Program ``p`` counts every slot per expert (and those before its own
    run of ``slots_per_program`` slots), places its own slots (stable: the
    same order as a stable sort), then marks the padding, spare tail and
    block experts among its own ``positions_per_program`` positions. The
    three kinds of position (real slots, an expert's padding, the spare
    tail) are disjoint, so no store needs ordering against another program's.
    Only the placement compares each slot with every expert (its rank among
    the expert's slots); padding and tail are plain stores (decode at 128
    experts pads to ~2,000 positions, which a per-position expert search made
    the slowest launch of the layer). With ``OCTAVO_MOE_CHUNKED_ALIGN=0`` one
    program takes every slot and position."""
    pid = tl.program_id(0)
    first_slot = pid * slots_per_program
    experts = tl.arange(0, E_PAD)
    counts = tl.zeros([E_PAD], tl.int32)
    before = tl.zeros([E_PAD], tl.int32)  # each expert's slots in earlier programs' runs
    for start in range(0, num_slots, COUNT_BLOCK):
        offs = start + tl.arange(0, COUNT_BLOCK)
        ids = tl.load(ids_ptr + offs, mask=offs < num_slots, other=-1)
        counts += tl.histogram(ids, E_PAD, mask=ids >= 0)
        before += tl.histogram(ids, E_PAD, mask=(ids >= 0) & (offs < first_slot))
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    total = tl.sum(padded, axis=0)
    seen = before
    for start in range(first_slot, tl.minimum(first_slot + slots_per_program, num_slots), BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ids = tl.load(ids_ptr + offs, mask=offs < num_slots, other=-1)
        onehot = (ids[:, None] == experts[None, :]).to(tl.int32)
        earlier = tl.cumsum(onehot, axis=0) - onehot  # same-expert slots before this one in the chunk
        dest = tl.sum(onehot * (earlier + seen[None, :] + starts[None, :]), axis=1)
        tl.store(sorted_slots_ptr + dest, offs, mask=ids >= 0)
        seen += tl.sum(onehot, axis=0)
    # This program's positions (a multiple of BLOCK_M of them, so blocks are whole).
    lo = pid * positions_per_program
    hi = tl.minimum(lo + positions_per_program, max_padded)
    # Each expert's padding: fewer than BLOCK_M positions after its slots.
    pad = starts[:, None] + counts[:, None] + tl.arange(0, BLOCK_M)[None, :]
    tl.store(sorted_slots_ptr + pad, num_slots, mask=(pad < ends[:, None]) & (pad >= lo) & (pad < hi))
    # The spare tail past the last expert's run.
    for start in range(lo, hi, FILL_BLOCK):
        pos = start + tl.arange(0, FILL_BLOCK)
        tl.store(sorted_slots_ptr + pos, num_slots, mask=(pos >= total) & (pos < hi))
    # Every block's expert: the one whose run holds the block's first position.
    for start in range(lo // BLOCK_M, hi // BLOCK_M, BLOCK):
        blocks = start + tl.arange(0, BLOCK)
        first = blocks * BLOCK_M
        owner = tl.sum((ends[None, :] <= first[:, None]).to(tl.int32), axis=1)
        tl.store(block_experts_ptr + blocks, tl.where(first < total, owner, -1), mask=first < hi)


def align_to_experts(
    topk_ids: torch.Tensor, num_experts: int, block_m: int, chunked: bool | None = None, max_slots: int | None = None,
) -> ExpertAlignment:
    """Slots sorted by expert, each expert's run padded to whole blocks (see module
    docstring); ``chunked`` (default: ``OCTAVO_MOE_CHUNKED_ALIGN``) picks the form,
    ``max_slots`` (tuning runs) moves the kernel's limit past which the sort runs."""
    num_slots = topk_ids.numel()
    chunked = chunked_align_enabled() if chunked is None else chunked
    if max_slots is None:
        max_slots = CHUNKED_ALIGN_MAX_SLOTS if chunked else ALIGN_KERNEL_MAX_SLOTS
    if num_slots > max_slots:
        return align_to_experts_torch(topk_ids, num_experts, block_m)
    max_padded = max_padded_slots(num_slots, num_experts, block_m)
    sorted_slots = torch.empty(max_padded, dtype=torch.int32, device=topk_ids.device)
    block_experts = torch.empty(max_padded // block_m, dtype=torch.int32, device=topk_ids.device)
    ids = topk_ids.reshape(-1).to(torch.int32)
    slots_per_program = SLOTS_PER_PROGRAM if chunked else cdiv(num_slots, _ALIGN_BLOCK) * _ALIGN_BLOCK
    num_programs = max(1, cdiv(num_slots, slots_per_program))
    positions_per_program = cdiv(max_padded // block_m, num_programs) * block_m
    _align_kernel[(num_programs,)](
        ids, sorted_slots, block_experts, num_slots, max_padded, slots_per_program, positions_per_program,
        E_PAD=max(16, triton.next_power_of_2(num_experts)), BLOCK=_ALIGN_BLOCK, BLOCK_M=block_m,
        FILL_BLOCK=_ALIGN_FILL_BLOCK, COUNT_BLOCK=_ALIGN_COUNT_BLOCK, num_warps=4,
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


# Up to this many slots a kernel may compute its own block of the alignment
# (``block_of_alignment``) instead of reading ``align_to_experts``' output:
# every program then compares each slot with every expert, a few thousand
# operations at decode sizes, and the alignment launch is saved.
IN_KERNEL_ALIGN_MAX_SLOTS = 128


@triton.jit
def block_of_alignment(
    ids_ptr, pid_m, num_slots, BLOCK_M: tl.constexpr, E_PAD: tl.constexpr, SLOTS_PAD: tl.constexpr,
):
    """(expert, slots) of block ``pid_m`` of ``align_to_experts``' layout,
    computed from ``topk_ids`` (flat, ``num_slots <= SLOTS_PAD``) in the
    program: the same expert (-1 past the end) and the same slots in the
    same order (the sentinel ``num_slots`` for padding) as the aligned arrays."""
    offs = tl.arange(0, SLOTS_PAD)
    ids = tl.load(ids_ptr + offs, mask=offs < num_slots, other=-1)
    experts = tl.arange(0, E_PAD)
    counts = tl.sum((ids[:, None] == experts[None, :]).to(tl.int32), axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    first = pid_m * BLOCK_M
    owner = tl.sum((ends <= first).to(tl.int32), axis=0)
    owner_start = tl.sum(tl.where(experts == owner, ends - padded, 0), axis=0)
    mine = ids == owner
    # Position of each of the owner's slots in this block (stable: slot order).
    pos = tl.cumsum(mine.to(tl.int32), axis=0) - 1 - (first - owner_start)
    hit = mine[:, None] & (pos[:, None] == tl.arange(0, BLOCK_M)[None, :])
    slots = tl.sum(tl.where(hit, offs[:, None], 0), axis=0)
    slots = tl.where(tl.sum(hit.to(tl.int32), axis=0) > 0, slots, num_slots)
    return tl.where(first < tl.sum(padded, axis=0), owner, -1), slots
