"""Quantization kernels: plain-torch references (the CPU path) and Triton
kernels (the GPU path), one format per module.

Every Triton entry point has a torch reference in the same family of
modules and is tested against it, on the CPU through Triton's interpreter
(``TRITON_INTERPRET=1``). Triton modules are imported lazily, only when a
tensor on a GPU reaches them, so that a CPU-only install never needs Triton.
"""

from __future__ import annotations

import torch


def use_triton(x: torch.Tensor) -> bool:
    """True when ``x`` lives on a GPU that Triton can compile for."""
    if x.device.type != "cuda":
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
