"""Persistent input buffers: pinned host arrays and their device twins.

Allocated once at the largest step size, refilled every step, so that input
preparation allocates nothing, host-to-device copies are asynchronous (from
pinned memory), and captured graphs can read the same device addresses on
every replay. On the CPU the host array and the "device" tensor are one.

With ``fresh=True`` (``Platform.fresh_step_inputs``: lazy-tensor devices such
as XLA) there are no device twins: each upload is a new device tensor, since
a copy into a persistent device buffer would become part of the traced step.
"""

from __future__ import annotations

import numpy as np
import torch


class StagedBuffer:
    def __init__(
        self, size: int, dtype: torch.dtype, device: torch.device, pin_memory: bool = False, fresh: bool = False
    ) -> None:
        on_cpu = device.type == "cpu"
        self.host = torch.zeros(size, dtype=dtype, pin_memory=pin_memory and not on_cpu)
        self.np: np.ndarray = self.host.numpy()
        self.fresh = fresh
        self.target = device
        self.device = self.host if on_cpu or self.fresh else torch.zeros(size, dtype=dtype, device=device)

    def upload(self, num: int, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        """Copy the first ``num`` host values to the device (async); return that
        view (shaped ``shape`` if given)."""
        if self.fresh:
            # A copy of the host values (the staging buffer is rewritten next
            # step), shaped on the host: on a lazy device even a view is traced.
            values = self.host[:num] if shape is None else self.host[:num].view(shape)
            return values.clone().to(self.target)
        if self.device is not self.host:
            self.device[:num].copy_(self.host[:num], non_blocking=True)
        return self.device[:num] if shape is None else self.device[:num].view(shape)


class InputBuffers:
    def __init__(
        self,
        max_num_tokens: int,
        max_num_reqs: int,
        max_blocks_per_req: int,
        device: torch.device,
        pin_memory: bool = False,
        fresh: bool = False,
    ) -> None:
        self.device = device
        self.fresh = fresh
        self.max_num_tokens = max_num_tokens
        self.max_num_reqs = max_num_reqs
        self.max_blocks_per_req = max_blocks_per_req
        # Pinned where the platform says so (``Platform.pins_host_memory``).
        staged = dict(device=device, pin_memory=pin_memory, fresh=fresh)
        self.input_ids = StagedBuffer(max_num_tokens, torch.int64, **staged)
        self.positions = StagedBuffer(max_num_tokens, torch.int64, **staged)
        self.slot_mapping = StagedBuffer(max_num_tokens, torch.int64, **staged)
        self.query_start_loc = StagedBuffer(max_num_reqs + 1, torch.int32, **staged)
        self.seq_lens = StagedBuffer(max_num_reqs, torch.int32, **staged)
        # Flat, so that a step can use a [num_reqs, width] view of any width.
        self.block_table = StagedBuffer(max_num_reqs * max_blocks_per_req, torch.int32, **staged)
        # The fixed-shape table captured graphs read: each graph step copies
        # the columns it uses into it on the device (none with fresh inputs).
        self.graph_block_table = (
            None if fresh else torch.zeros(max_num_reqs, max_blocks_per_req, dtype=torch.int32, device=device)
        )

    def to_device(self, values: np.ndarray) -> torch.Tensor:
        """A small host array as a device tensor (not staged)."""
        return torch.from_numpy(values).to(self.device, non_blocking=not self.fresh)
