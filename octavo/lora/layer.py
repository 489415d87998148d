"""LoRA on a linear layer: every loaded adapter's low-rank update at once.

A layer with LoRA keeps, per output shard ``s`` (q/k/v of a fused qkv
projection, gate/up of a fused MLP projection, or the whole layer), the
``A`` matrices of all ``max_loras`` slots stacked (``a_stack``: ``[shards *
slots * rank, in]``) and their ``B`` matrices side by side (``b_stacks[s]``:
``[out_s, slots * rank]``, the adapter's scaling folded in). A step's tokens
say which slot they use through one shared one-hot matrix
(``LoRAStepInputs.slot_onehot``: ``[tokens, slots]``, zeros for a token with
no adapter), so the update of every token is

    out[:, shard s] += ((x @ A_s^T) * onehot expanded over the rank) @ B_s^T

two dense matmuls whose inner size is ``slots * rank``, with no gather and
no shape that depends on which adapters the step uses: the same code runs
eagerly, inside a captured CUDA graph (the one-hot matrix and the stacks are
persistent buffers written in place) and under static step shapes. A slot
with no adapter holds zeros, and a rank below ``max_lora_rank`` is zero-padded.

Tensor parallelism: a column-parallel layer keeps ``A`` whole and this
rank's rows of each ``B``; a row-parallel layer keeps this rank's columns of
``A`` and adds its partial update before the partial outputs are summed
(the update is linear in ``x``, so the sum over ranks is the whole update).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass(frozen=True)
class LoRAShape:
    """How many adapters a layer holds at once and their largest rank."""

    max_loras: int
    max_rank: int


class LoRAStepInputs:
    """The step's token -> slot one-hot matrix, shared by every LoRA layer.

    Written before each step (``set_token_slots``); layers read its first
    ``num_tokens`` rows, padded tokens included (their rows are zeros)."""

    def __init__(self, max_tokens: int, shape: LoRAShape, dtype: torch.dtype, device: torch.device) -> None:
        self.shape = shape
        self.slot_onehot = torch.zeros(max_tokens, shape.max_loras, dtype=dtype, device=device)
        self._slot_ids = torch.arange(shape.max_loras, dtype=torch.int32, device=device)
        self._token_slots = torch.full((max_tokens,), -1, dtype=torch.int32, device=device)

    def set_token_slots(self, token_slots: torch.Tensor) -> None:
        """``token_slots``: each token's slot (-1: no adapter), on the host or device."""
        count = token_slots.shape[0]
        slots = self._token_slots[:count]
        slots.copy_(token_slots, non_blocking=True)
        self.slot_onehot[:count].copy_(slots.unsqueeze(1) == self._slot_ids)


# A target that covers every shard of a fused layer (its B rows: the shards' in order).
ALL_SHARDS = -1


@dataclass
class LoRATarget:
    """One module a PEFT adapter may name, and where it lands in the layer."""

    shard: int  # index into the layer's shards, or ALL_SHARDS
    in_features: int  # the whole (unsharded) input size
    out_features: int  # the whole output size of this shard (of all of them)
    shard_sizes: tuple[int, ...] = ()  # with ALL_SHARDS: each shard's whole output size


@dataclass
class LinearLoRA:
    """The LoRA state of one linear layer (built by ``LoRABuildScope``)."""

    layer: nn.Module
    inputs: LoRAStepInputs
    # Per shard: (offset in this rank's output, start in the whole B's rows, rows).
    out_slices: list[tuple[int, int, int]]
    # Column-parallel layers use all of A; row-parallel ones this rank's columns.
    in_slice: tuple[int, int]
    row_parallel: bool
    targets: dict[str, LoRATarget] = field(default_factory=dict)

    def __post_init__(self) -> None:
        shape, layer = self.inputs.shape, self.layer
        width = shape.max_loras * shape.max_rank
        dtype, device = self.inputs.slot_onehot.dtype, self.inputs.slot_onehot.device
        num_shards = len(self.out_slices)
        layer.register_buffer(
            "lora_a_stack", torch.zeros(num_shards * width, self.in_slice[1], dtype=dtype, device=device), persistent=False
        )
        for index, (_, _, rows) in enumerate(self.out_slices):
            layer.register_buffer(f"lora_b_stack_{index}", torch.zeros(rows, width, dtype=dtype, device=device), persistent=False)

    @property
    def a_stack(self) -> torch.Tensor:
        return self.layer.lora_a_stack

    def b_stack(self, shard: int) -> torch.Tensor:
        return getattr(self.layer, f"lora_b_stack_{shard}")

    def add_update(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out`` (this layer's product of ``x``) plus every token's LoRA update."""
        shape = self.inputs.shape
        width = shape.max_loras * shape.max_rank
        tokens = x.reshape(-1, x.shape[-1])
        flat = out.view(-1, out.shape[-1])  # a view (never a copy): the updates land in ``out``
        onehot = self.inputs.slot_onehot[: tokens.shape[0]]
        # [tokens, shards, slots, rank], zero outside each token's slot.
        shrunk = (tokens @ self.a_stack.t()).view(tokens.shape[0], len(self.out_slices), shape.max_loras, shape.max_rank)
        shrunk = shrunk * onehot[:, None, :, None]
        for index, (offset, _, rows) in enumerate(self.out_slices):
            update = shrunk[:, index].reshape(tokens.shape[0], width) @ self.b_stack(index).t()
            flat[:, offset : offset + rows] += update.to(flat.dtype)
        return out

    def clear_slot(self, slot: int) -> None:
        for shard in range(len(self.out_slices)):
            self._slot_rows(shard, slot).zero_()
            self._slot_columns(shard, slot).zero_()

    def write_slot(self, slot: int, shard: int, lora_a: torch.Tensor, lora_b: torch.Tensor) -> None:
        """Place one adapter's ``A`` ([rank, in]) and scaled ``B`` ([out, rank]) of one shard."""
        rank = lora_a.shape[0]
        start, size = self.in_slice
        if self.row_parallel:
            lora_a = lora_a[:, start : start + size]
        _, row_start, rows = self.out_slices[shard]
        lora_b = lora_b[row_start : row_start + rows]
        self._slot_rows(shard, slot)[:rank].copy_(lora_a, non_blocking=True)
        self._slot_columns(shard, slot)[:, :rank].copy_(lora_b, non_blocking=True)

    def _slot_rows(self, shard: int, slot: int) -> torch.Tensor:
        shape = self.inputs.shape
        first = (shard * shape.max_loras + slot) * shape.max_rank
        return self.a_stack[first : first + shape.max_rank]

    def _slot_columns(self, shard: int, slot: int) -> torch.Tensor:
        rank = self.inputs.shape.max_rank
        return self.b_stack(shard)[:, slot * rank : (slot + 1) * rank]


class LoRABuildScope:
    """Open while a model is built: linear layers created inside get LoRA.

    Collects each layer's ``LinearLoRA`` by the layer's prefix; the runner's
    ``LoRASlots`` then loads adapters into them."""

    def __init__(self, inputs: LoRAStepInputs) -> None:
        self.inputs = inputs
        self.layers: dict[str, LinearLoRA] = {}

    def attach(self, layer: nn.Module, lora: LinearLoRA) -> LinearLoRA:
        self.layers[layer.prefix] = lora
        return lora


_current: ContextVar[LoRABuildScope | None] = ContextVar("octavo_lora_scope", default=None)


@contextlib.contextmanager
def lora_build_scope(scope: LoRABuildScope | None) -> Iterator[LoRABuildScope | None]:
    """Linear layers constructed inside this block take LoRA state from ``scope``."""
    token = _current.set(scope)
    try:
        yield scope
    finally:
        _current.reset(token)


def current_lora_scope() -> LoRABuildScope | None:
    return _current.get()
