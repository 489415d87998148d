"""Programmatic dependent launch (PDL, Hopper and later) for the decode chain.

A batch-1 decode step is a chain of short kernels (norm, GEMV, rotary and
cache write, attention, GEMV, ...), each a few microseconds: without PDL
the next kernel is launched only once the one before has finished and its
writes are flushed, so every boundary leaves the GPU draining and filling
(the tail of one kernel's last wave, the next one's launch). With PDL a
kernel is launched while the one before still runs: its programs start as
SMs free up, do what needs nothing from the kernel before (address
arithmetic; a GEMV's first weight tile, which no kernel writes), then wait
(``griddepcontrol.wait``: the previous kernel complete and its memory
visible) before they read an activation or write anything.

The rules every kernel launched with ``launch_pdl=True`` keeps, so that the
chain stays ordered through it:

* every program calls ``pdl_wait`` before its first load of data another
  kernel writes and before its first store (a store before the wait could
  overwrite memory the previous kernel still reads: the caching allocator
  reuses blocks in stream order);
* ``pdl_release`` (``griddepcontrol.launch_dependents``) comes after the
  program's main loop, so that the next kernel's programs take SMs as this
  one's finish rather than crowding its later waves.

Kernels without PDL (cuBLAS, torch's) are launched as always and stay
ordered: a PDL kernel after one of them waits for it in ``pdl_wait``. CUDA
graphs keep the programmatic edges (CUDA 12.3+).

``OCTAVO_PDL=1`` turns it on, on NVIDIA GPUs of compute capability 9.0 and
later (Triton's interpreter and ROCm never). It is off by default until a
GPU round has measured it (``benchmarks/gpu_round.sh pdl``).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from octavo.kernels.triton_utils import interpreting

PDL_ENV = "OCTAVO_PDL"


@functools.cache
def _device_has_pdl(index: int) -> bool:
    return torch.version.hip is None and torch.cuda.get_device_capability(index) >= (9, 0)


def pdl_enabled(device: torch.device) -> bool:
    """Whether the decode chain's kernels on ``device`` launch with PDL."""
    if device.type != "cuda" or os.environ.get(PDL_ENV, "0") != "1" or interpreting():
        return False
    return _device_has_pdl(device.index if device.index is not None else torch.cuda.current_device())


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Wait for the kernel before (complete, its writes visible); nothing without PDL."""
    if PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def pdl_release(PDL: tl.constexpr):
    """Let the next kernel's programs start as this one's finish; nothing without PDL."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
