"""A step's results copied to the host without waiting for them.

Async scheduling (``async_steps.py``) and overlapped pooling steps
(``pooling_runner.py``) launch a step, then do host work while it runs: its
results must come back to pinned host memory behind an event, which the
host waits on only when it reads them. Where the platform records no
events or pins no memory, the copy is an ordinary blocking one.
"""

from __future__ import annotations

import torch


def copy_to_host(tensors: list[torch.Tensor], platform) -> tuple[list[torch.Tensor], object | None]:
    """``tensors`` (on one device) on the host, and the event to wait on before
    reading them (None: already there). CPU tensors are returned as they are."""
    if tensors[0].device.type == "cpu":
        return tensors, None
    done = platform.create_event()
    asynchronous = done is not None and platform.pins_host_memory
    host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=asynchronous) for t in tensors]  # torch's caching host allocator
    for target, source in zip(host, tensors):
        target.copy_(source, non_blocking=asynchronous)
    if not asynchronous:
        return host, None
    done.record()
    return host, done
