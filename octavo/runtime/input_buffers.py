"""Persistent input buffers: pinned host arrays and their device twins.

Allocated once at the largest step size, refilled every step, so that input
preparation allocates nothing, host-to-device copies are asynchronous (from
pinned memory), and captured graphs can read the same device addresses on
every replay. On the CPU the host array and the "device" tensor are one.
"""

from __future__ import annotations

import numpy as np
import torch


class StagedBuffer:
    def __init__(self, size: int, dtype: torch.dtype, device: torch.device, pin_memory: bool = False) -> None:
        on_cpu = device.type == "cpu"
        self.host = torch.zeros(size, dtype=dtype, pin_memory=pin_memory and not on_cpu)
        self.np: np.ndarray = self.host.numpy()
        self.device = self.host if on_cpu else torch.zeros(size, dtype=dtype, device=device)

    def upload(self, num: int) -> torch.Tensor:
        """Copy the first ``num`` host values to the device (async); return that view."""
        if self.device is not self.host:
            self.device[:num].copy_(self.host[:num], non_blocking=True)
        return self.device[:num]


class InputBuffers:
    def __init__(
        self, max_num_tokens: int, max_num_reqs: int, max_blocks_per_req: int, device: torch.device, pin_memory: bool = False
    ) -> None:
        self.max_num_tokens = max_num_tokens
        self.max_num_reqs = max_num_reqs
        self.max_blocks_per_req = max_blocks_per_req
        # Pinned where the platform says so (``Platform.pins_host_memory``).
        self.input_ids = StagedBuffer(max_num_tokens, torch.int64, device, pin_memory)
        self.positions = StagedBuffer(max_num_tokens, torch.int64, device, pin_memory)
        self.slot_mapping = StagedBuffer(max_num_tokens, torch.int64, device, pin_memory)
        self.query_start_loc = StagedBuffer(max_num_reqs + 1, torch.int32, device, pin_memory)
        self.seq_lens = StagedBuffer(max_num_reqs, torch.int32, device, pin_memory)
        # Flat, so that a step can use a [num_reqs, width] view of any width.
        self.block_table = StagedBuffer(max_num_reqs * max_blocks_per_req, torch.int32, device, pin_memory)
        # The fixed-shape table captured graphs read: each graph step copies
        # the columns it uses into it on the device.
        self.graph_block_table = torch.zeros(max_num_reqs, max_blocks_per_req, dtype=torch.int32, device=device)
