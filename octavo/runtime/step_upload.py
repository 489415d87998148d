"""A step's small host arrays copied to the device together.

On a GPU each host-to-device copy from pageable memory costs the host about
the same few microseconds whatever its size (staging, a driver call, the
dispatcher), and an encoder's pooling step has eight small ones (its ids,
positions, attention grid and pooling segments). Packed into one host
buffer (each array at an 8-byte boundary) they cross in one copy and are
viewed back on the device as their dtypes and shapes: a view, no kernel.
Elsewhere each array goes as it is: on the CPU a copy is no copy, and on a
lazy-tensor device (XLA) views of one upload would be traced into the step.
The runner decides from its platform (``packs_uploads``).
"""

from __future__ import annotations

import numpy as np
import torch

ALIGN = 8  # bytes: the widest dtype here (int64), so every view starts aligned


def packs_uploads(platform) -> bool:
    """Whether ``platform``'s uploads are worth packing: real host-to-device
    transfers (it pins staging memory) into persistent device tensors."""
    return bool(platform.pins_host_memory and not platform.fresh_step_inputs)


def upload_together(arrays: dict[str, np.ndarray], device: torch.device, pack: bool) -> dict[str, torch.Tensor]:
    """``arrays`` on ``device``, by name; ``pack`` sends them in one copy."""
    if not pack:
        return {name: torch.from_numpy(array).to(device, non_blocking=True) for name, array in arrays.items()}
    arrays = {name: np.ascontiguousarray(array) for name, array in arrays.items()}
    starts, size = {}, 0
    for name, array in arrays.items():
        starts[name] = size
        size += -(-array.nbytes // ALIGN) * ALIGN
    host = np.empty(max(size, ALIGN), dtype=np.uint8)
    for name, array in arrays.items():
        host[starts[name] : starts[name] + array.nbytes] = array.reshape(-1).view(np.uint8)
    # Pageable memory: the copy has read ``host`` when it returns, so it may go.
    packed = torch.from_numpy(host).to(device, non_blocking=True)
    return {
        name: packed[starts[name] : starts[name] + array.nbytes].view(torch.from_numpy(array[:0]).dtype).view(array.shape)
        for name, array in arrays.items()
    }
