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

On by default on NVIDIA GPUs of compute capability 9.0 and later (Triton's
interpreter and ROCm never), for launches of at most ``PDL_MAX_TOKENS``
tokens: the decode steps of small batches, where kernel boundaries are the
cost. ``OCTAVO_PDL=0`` turns it off. Measured on an H100 (same warm
machine, batch-1 decode, ``benchmarks/RESULTS.md``): Llama-3.1-8B 5.62 ->
5.48 ms a token, at 8k context 6.14 -> 6.06, Gemma-2-9B 7.09 -> 6.86,
Qwen3-30B-A3B (48 MoE layers, ~13 kernels each) 3.92 -> 3.42; 512 streams'
throughput (steps of 512 tokens and more, which never take it) unchanged.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from octavo.kernels.triton_utils import interpreting

PDL_ENV = "OCTAVO_PDL"
# Launches covering more tokens than this run without it: their kernels are
# long enough that a boundary costs little, and early-placed programs of the
# next kernel would only take SM slots from this one's later waves.
PDL_MAX_TOKENS = 64


@functools.cache
def _device_has_pdl(index: int) -> bool:
    return torch.version.hip is None and torch.cuda.get_device_capability(index) >= (9, 0)


def _turned_off() -> bool:
    return os.environ.get(PDL_ENV, "1") == "0"


def pdl_enabled(device: torch.device, num_tokens: int) -> bool:
    """Whether a decode-chain kernel over ``num_tokens`` tokens on ``device`` launches with PDL."""
    if device.type != "cuda" or num_tokens > PDL_MAX_TOKENS or _turned_off() or interpreting():
        return False
    return _device_has_pdl(device.index if device.index is not None else torch.cuda.current_device())


def pdl_status(device: torch.device) -> str:
    """One line for ``octavo env``: whether the decode chain launches with PDL on ``device``."""
    if _turned_off():
        return f"off ({PDL_ENV}=0)"
    if pdl_enabled(device, 1):
        return f"on for decode launches of up to {PDL_MAX_TOKENS} tokens ({PDL_ENV}=0 turns it off)"
    return "not available here (NVIDIA compute capability 9.0 or later, compiled kernels)"


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
