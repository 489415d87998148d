"""A step's small host arrays copied to the device together.

On a GPU each host-to-device copy from pageable memory costs the host about
the same few microseconds whatever its size (staging, a driver call, the
dispatcher), and an encoder's pooling step has eight small ones (its ids,
positions, attention grid and pooling segments). Packed into one host
buffer (pinned on a GPU; each array at an 8-byte boundary) they cross in one copy and are
viewed back on the device as their dtypes and shapes: a view, no kernel.
Elsewhere each array goes as it is: on the CPU a copy is no copy, and on a
lazy-tensor device (XLA) views of one upload would be traced into the step.
The runner decides from its platform (``packs_uploads``). A captured graph
reads its inputs at fixed addresses: ``into`` (a device byte buffer) then
receives the packed copy, and the views are of it; arrays of the same
shapes, in the same order, land at the same offsets every time.
"""

from __future__ import annotations

import numpy as np
import torch

ALIGN = 8  # bytes: the widest dtype here (int64), so every view starts aligned


def packs_uploads(platform) -> bool:
    """Whether ``platform``'s uploads are worth packing: real host-to-device
    transfers (it pins staging memory) into persistent device tensors."""
    return bool(platform.pins_host_memory and not platform.fresh_step_inputs)


def _packed_layout(arrays: dict[str, np.ndarray]) -> tuple[dict[str, int], int]:
    """Each array's byte offset packed (at an ``ALIGN``-byte boundary, in order), and the bytes in all."""
    starts, size = {}, 0
    for name, array in arrays.items():
        starts[name] = size
        size += -(-array.nbytes // ALIGN) * ALIGN
    return starts, max(size, ALIGN)


def packed_size(arrays: dict[str, np.ndarray]) -> int:
    """Bytes ``arrays`` take packed (each at an ``ALIGN``-byte boundary)."""
    return _packed_layout(arrays)[1]


def upload_together(
    arrays: dict[str, np.ndarray], device: torch.device, pack: bool, into: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """``arrays`` on ``device``, by name; ``pack`` sends them in one copy, into
    the uint8 device buffer ``into`` when given (at least ``packed_size`` bytes)."""
    if not pack:
        return {name: torch.from_numpy(array).to(device, non_blocking=True) for name, array in arrays.items()}
    arrays = {name: np.ascontiguousarray(array) for name, array in arrays.items()}
    starts, size = _packed_layout(arrays)
    # Pinned staging on a GPU: a copy from pageable memory may wait for the
    # stream to drain before it stages (CUDA's API synchronization notes),
    # which would stall the host behind a step still in flight (overlapped
    # pooling steps). torch's caching host allocator hands the block out
    # again only once the copy that reads it has run.
    staging = torch.empty(size, dtype=torch.uint8, pin_memory=device.type == "cuda")
    host = staging.numpy()
    for name, array in arrays.items():
        host[starts[name] : starts[name] + array.nbytes] = array.reshape(-1).view(np.uint8)
    if into is None:
        packed = staging.to(device, non_blocking=True)
    else:
        if into.dtype != torch.uint8 or into.numel() < host.size:
            raise ValueError(f"the upload needs a uint8 buffer of {host.size} bytes, got {into.dtype} x {into.numel()}")
        packed = into
        packed[: host.size].copy_(staging, non_blocking=True)
    return {
        name: packed[starts[name] : starts[name] + array.nbytes].view(torch.from_numpy(array[:0]).dtype).view(array.shape)
        for name, array in arrays.items()
    }
