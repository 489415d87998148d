"""Checkpoint tensors as memory-mapped views, so that a rank reads only its slices.

A tensor-parallel rank needs a slice of most tensors, a pipeline stage only
its layers' tensors. ``safe_open(...).get_tensor`` copies a whole tensor into
memory; here each tensor is instead a zero-copy ``torch`` view of a private
memory map of the file. The layers' weight loaders then ``narrow`` the view
to their slice and copy that slice into the parameter: only the file pages
under the slice are ever read, tensors of other stages not at all, and no
full-size copy of a tensor is made.

Invariants:
- Files are parsed as safetensors (8-byte header length, JSON header, raw
  little-endian data); nothing is unpickled. Offsets are checked against the
  file size and the declared shape before any view is made.
- The mapping is private (copy-on-write): a loader that wrote into a view
  could never change the file.
"""

from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Iterator
from pathlib import Path

import torch

from octavo.errors import ModelLoadError

# safetensors' dtype names (also read by models/safetensors_map.py).
SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
_MAX_HEADER_BYTES = 100 << 20


def read_header(file: Path) -> tuple[int, dict]:
    """(offset of the data section, ``{name: entry}``) of a safetensors file."""
    with open(file, "rb") as f:
        prefix = f.read(8)
        if len(prefix) != 8:
            raise ModelLoadError(f"{file.name} is not a safetensors file (too short)")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > _MAX_HEADER_BYTES:
            raise ModelLoadError(f"{file.name}: safetensors header of {header_len} bytes is implausible")
        try:
            header = json.loads(f.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ModelLoadError(f"{file.name}: bad safetensors header: {exc}") from exc
    header.pop("__metadata__", None)
    return 8 + header_len, header


def _view(buffer: mmap.mmap, data_start: int, file_size: int, name: str, entry: dict, file: Path) -> torch.Tensor:
    dtype = SAFETENSORS_DTYPES.get(entry.get("dtype"))
    if dtype is None:
        raise ModelLoadError(f"{file.name}: tensor {name} has unsupported dtype {entry.get('dtype')!r}")
    shape = [int(d) for d in entry["shape"]]
    begin, end = (int(v) for v in entry["data_offsets"])
    numel = 1
    for dim in shape:
        numel *= dim
    element_size = torch.empty((), dtype=dtype).element_size()
    if not 0 <= begin <= end or data_start + end > file_size or end - begin != numel * element_size:
        raise ModelLoadError(f"{file.name}: tensor {name} has inconsistent offsets {begin}..{end} for shape {shape}")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(buffer, dtype=dtype, count=numel, offset=data_start + begin)
    return flat.view(shape)


def iterate_safetensors_views(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, view)`` for every tensor of ``files``, in file order."""
    for file in files:
        data_start, header = read_header(file)
        file_size = file.stat().st_size
        with open(file, "rb") as f:
            # ACCESS_COPY: writable private pages (torch wants a writable
            # buffer), still read lazily from the file.
            buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        for name in sorted(header, key=lambda n: header[n]["data_offsets"][0]):
            yield name, _view(buffer, data_start, file_size, name, header[name], file)
