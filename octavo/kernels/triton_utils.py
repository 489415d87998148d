"""Small helpers shared by the kernel launchers (host side only).

Triton's interpreter (``TRITON_INTERPRET=1``) runs kernels with numpy on the
CPU. It stores bfloat16 as raw 16-bit integers and its ``tl.dot`` multiplies
those raw integers, so under the interpreter every matrix product upcasts its
operands to float32 first (``dot_dtype``). On a GPU the operands stay in the
input dtype so that tensor cores run them.
"""

from __future__ import annotations

import functools
import os

import torch
import triton.language as tl


_TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def runs_ptx(device: torch.device) -> bool:
    """Whether Triton kernels on ``device`` compile to NVIDIA PTX, so that inline PTX
    runs there (CUDA; not ROCm, not the interpreter)."""
    return device.type == "cuda" and torch.version.hip is None and not interpreting()


def ints_from_env(name: str, expected: str, lengths: tuple[int, ...]) -> tuple[int, ...] | None:
    """A tuning override such as ``OCTAVO_MOE_TILES=16,64,128,4,4``: the
    integers in ``name`` (one of ``lengths`` of them), or None when unset.
    ``expected`` names the fields for the error a malformed value raises."""
    value = os.environ.get(name)
    if not value:
        return None
    try:
        parts = tuple(int(part) for part in value.split(","))
    except ValueError:
        parts = ()
    if len(parts) not in lengths:
        raise ValueError(f"{name}={value!r}: expected {expected}")
    return parts


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def dot_dtype(dtype: torch.dtype):
    """The Triton dtype matrix-product operands are cast to for ``dtype`` inputs."""
    if interpreting() or dtype == torch.float32:
        return tl.float32
    return _TL_DTYPES[dtype]


def cache_dot_dtype(query_dtype: torch.dtype, cache_dtype: torch.dtype):
    """The matrix-product dtype of attention that reads every key and value
    from a cache of ``cache_dtype``: float16 over an fp8 cache, else
    ``dot_dtype``. fp8 widens to float16 exactly in one instruction a pair
    (Hopper's ``cvt`` from e4m3x2); to bfloat16 it takes one more conversion
    a value (the sm_90 loop of the fp8 split-KV decode kernel: 1,250
    instructions, 256 of them F2F, against 877 with float16). float16 also
    keeps more of the queries' and probabilities' bits."""
    if interpreting() or query_dtype == torch.float32 or cache_dtype.itemsize != 1:
        return dot_dtype(query_dtype)
    return tl.float16


def dot_precision(dtype: torch.dtype) -> str | None:
    """float32 products in full precision (no TF32), like the torch reference;
    None (the backend's default) for half-precision inputs, where it is moot."""
    return "ieee" if interpreting() or dtype == torch.float32 else None


@functools.cache
def shared_memory_bytes(device: torch.device) -> int:
    """Shared memory a program may take on ``device`` (CUDA's opt-in limit; 0 elsewhere, where
    tile tables keep to their smallest form)."""
    if device.type != "cuda" or torch.version.hip is not None:
        return 0
    return int(getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", 0))
