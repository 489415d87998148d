"""Opening a GGUF file: a bounds-checked scan of its header, then the
``gguf`` package's ``GGUFReader``.

``GGUFReader`` trusts the header: a corrupt array length makes it loop for
ages, a corrupt tensor shape overflows numpy's uint64 product, and a
truncated file fails deep inside numpy. So Octavo first walks the header
itself, reading every count and length with the bytes that remain in mind,
and only then hands the file to the reader. Invariants after ``open_gguf``:

* every metadata value and tensor description lies inside the file;
* every tensor has 1-4 dims, each >= 1, a ggml type the ``gguf`` package
  knows, rows that are whole blocks of that type, and data (computed with
  Python integers, so no overflow) inside the file, at an aligned offset;
* tensor names are unique.

Errors are ``ModelLoadError`` naming the file and the field or tensor.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from octavo.errors import ModelLoadError

_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
_MAX_DIMS = 4
_MAX_ARRAY_DEPTH = 4
_DEFAULT_ALIGNMENT = 32


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    dims: tuple[int, ...]  # ggml order: dims[0] is the innermost (a row's length)
    type_id: int
    data_offset: int  # from the start of the file
    num_bytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """The torch (row-major) shape: ggml dims reversed."""
        return tuple(reversed(self.dims))


@dataclass
class GGUFFile:
    path: Path
    version: int
    tensors: dict[str, GGUFTensorInfo]
    reader: Any  # gguf.GGUFReader

    def field(self, key: str, default: Any = None) -> Any:
        field = self.reader.fields.get(key)
        if field is None:
            return default
        try:
            return field.contents()
        except Exception as exc:  # malformed value
            raise ModelLoadError(f"{self.path.name}: metadata field {key!r} cannot be read: {exc}") from exc


class _Scanner:
    def __init__(self, path: Path, data: mmap.mmap) -> None:
        self.path, self.data, self.pos, self.size = path, data, 0, len(data)

    def fail(self, message: str) -> ModelLoadError:
        return ModelLoadError(f"{self.path.name}: {message}")

    def take(self, num_bytes: int, what: str) -> bytes:
        if num_bytes < 0 or self.pos + num_bytes > self.size:
            raise self.fail(f"the file ends inside {what} (truncated or corrupt)")
        chunk = self.data[self.pos : self.pos + num_bytes]
        self.pos += num_bytes
        return chunk

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack("<Q", self.take(8, what))[0]

    def string(self, what: str) -> str:
        length = self.u64(f"the length of {what}")
        raw = self.take(length, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"{what} is not valid UTF-8") from exc

    def skip_value(self, value_type: int, what: str, depth: int = 0) -> Any:
        """Skip a metadata value; returns it when it is a uint32 (alignment)."""
        if value_type in _SCALAR_SIZES:
            raw = self.take(_SCALAR_SIZES[value_type], what)
            return struct.unpack("<I", raw)[0] if value_type == _UINT32 else None
        if value_type == _STRING:
            self.string(what)
            return None
        if value_type != _ARRAY or depth >= _MAX_ARRAY_DEPTH:
            raise self.fail(f"{what} has an unknown value type {value_type}")
        item_type = self.u32(f"the item type of {what}")
        count = self.u64(f"the length of {what}")
        min_item = _SCALAR_SIZES.get(item_type, 8)  # strings and arrays start with 8 bytes
        if count * min_item > self.size - self.pos:
            raise self.fail(f"{what} claims {count} items, more than the file can hold")
        if item_type in _SCALAR_SIZES:
            self.take(count * min_item, what)
        else:
            for index in range(count):
                self.skip_value(item_type, f"{what}[{index}]", depth + 1)
        return None


def _scan_tensor_info(scanner: _Scanner, index: int) -> tuple[str, tuple[int, ...], int, int]:
    name = scanner.string(f"the name of tensor #{index}")
    num_dims = scanner.u32(f"the dims of tensor {name!r}")
    if not 1 <= num_dims <= _MAX_DIMS:
        raise scanner.fail(f"tensor {name!r} has {num_dims} dimensions (1 to {_MAX_DIMS} allowed)")
    dims = tuple(scanner.u64(f"the dims of tensor {name!r}") for _ in range(num_dims))
    type_id = scanner.u32(f"the type of tensor {name!r}")
    offset = scanner.u64(f"the offset of tensor {name!r}")
    return name, dims, type_id, offset


def _tensor_info(scanner: _Scanner, fields: tuple, data_start: int, alignment: int) -> GGUFTensorInfo:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    name, dims, type_id, offset = fields
    if any(d < 1 for d in dims):
        raise scanner.fail(f"tensor {name!r} has an empty dimension {dims}")
    try:
        ggml_type = GGMLQuantizationType(type_id)
    except ValueError:
        raise scanner.fail(f"tensor {name!r} has an unknown ggml type id {type_id}") from None
    block_elems, block_bytes = GGML_QUANT_SIZES[ggml_type]
    if dims[0] % block_elems:
        raise scanner.fail(f"tensor {name!r}: rows of {dims[0]} values are not whole {ggml_type.name} blocks of {block_elems}")
    num_elems = 1
    for d in dims:  # Python integers: no overflow
        num_elems *= d
    num_bytes = num_elems // block_elems * block_bytes
    start = data_start + offset
    if offset % alignment:
        raise scanner.fail(f"tensor {name!r} starts at offset {offset}, not a multiple of the alignment {alignment}")
    if start + num_bytes > scanner.size:
        raise scanner.fail(
            f"tensor {name!r} ({ggml_type.name} {list(reversed(dims))}) needs bytes {start}..{start + num_bytes} "
            f"but the file has {scanner.size} (truncated?)"
        )
    return GGUFTensorInfo(name, dims, type_id, start, num_bytes)


def scan_gguf(path: Path) -> tuple[int, dict[str, GGUFTensorInfo]]:
    """Validate ``path``'s header; returns (version, tensors by name)."""
    try:
        with open(path, "rb") as f:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as exc:  # ValueError: an empty file cannot be mapped
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc
    with data:
        scanner = _Scanner(path, data)
        if scanner.take(4, "the magic number") != b"GGUF":
            raise scanner.fail("not a GGUF file (bad magic number)")
        version = scanner.u32("the version")
        if version not in (2, 3):
            raise scanner.fail(f"GGUF version {version} is not supported (2, 3)")
        num_tensors, num_fields = scanner.u64("the tensor count"), scanner.u64("the field count")
        # Each field needs >= 12 bytes, each tensor description >= 28.
        if num_fields * 12 + num_tensors * 28 > scanner.size:
            raise scanner.fail(f"the header claims {num_fields} fields and {num_tensors} tensors, more than the file holds")
        alignment = _DEFAULT_ALIGNMENT
        for index in range(num_fields):
            key = scanner.string(f"the key of field #{index}")
            value = scanner.skip_value(scanner.u32(f"the type of field {key!r}"), f"field {key!r}")
            if key == "general.alignment":
                if value is None or value == 0 or value & (value - 1):
                    raise scanner.fail("field 'general.alignment' must be a uint32 power of two")
                alignment = value
        raw_tensors = [_scan_tensor_info(scanner, index) for index in range(num_tensors)]
        data_start = -(-scanner.pos // alignment) * alignment
        tensors: dict[str, GGUFTensorInfo] = {}
        for fields in raw_tensors:
            info = _tensor_info(scanner, fields, data_start, alignment)
            if info.name in tensors:
                raise scanner.fail(f"tensor {info.name!r} appears twice")
            tensors[info.name] = info
    return version, tensors


def open_gguf(path: Path) -> GGUFFile:
    try:
        from gguf import GGUFReader
    except ImportError as exc:
        raise ModelLoadError("loading .gguf files needs the gguf package: pip install 'octavo[gguf]'") from exc
    version, tensors = scan_gguf(path)
    try:
        reader = GGUFReader(str(path), "r")
    except Exception as exc:  # the scan above should leave nothing for the reader to trip on
        raise ModelLoadError(f"{path.name}: the gguf reader failed: {exc}") from exc
    return GGUFFile(path=path, version=version, tensors=tensors, reader=reader)
