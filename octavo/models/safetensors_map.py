"""A safetensors file's tensors as views of one private mapping of the file.

``safetensors.safe_open`` gives each tensor its own storage (a slice of its
mapping), so two tensors that lie side by side in the file cannot be seen
as one. Here the whole file is mapped once (``UntypedStorage.from_file``,
copy-on-write: a write stays in the process, the file and the page cache
are untouched) and every tensor is a view of that one storage, so a fused
parameter whose shards the file holds back to back in its order (a Llama's
``gate_proj`` then ``up_proj``: safetensors writes names sorted) can take
the file's bytes without a copy (``weight_loading.place_shard``).

The header, read by ``weight_views.read_header``, is the one ``safe_open``
has already checked (it is opened first, and its names are the ones
yielded); a tensor this reader cannot express as a view (a dtype it does
not know, an offset its element size does not divide, a big-endian host)
is read by ``safe_open`` as before.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import torch

from octavo.distributed.weight_views import SAFETENSORS_DTYPES, read_header


def _view(storage: torch.UntypedStorage, data_start: int, entry: dict) -> torch.Tensor | None:
    dtype = SAFETENSORS_DTYPES.get(entry.get("dtype"))
    if dtype is None:
        return None
    begin, end = entry["data_offsets"]
    shape = list(entry["shape"])
    itemsize = dtype.itemsize
    numel = 1
    for size in shape:
        numel *= size
    start = data_start + begin
    if start % itemsize or end - begin != numel * itemsize or data_start + end > storage.nbytes():
        return None
    return torch.empty(0, dtype=dtype).set_(storage, start // itemsize, shape)


def iterate_mapped(path: Path, safe_file) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for each tensor of the open ``safe_file`` (its
    order), each a view of one private mapping of ``path``."""
    storage = None
    if sys.byteorder == "little" and path.stat().st_size > 0:
        data_start, entries = read_header(path)
        storage = torch.UntypedStorage.from_file(str(path), shared=False, nbytes=path.stat().st_size)
    for name in safe_file.keys():
        tensor = _view(storage, data_start, entries[name]) if storage is not None else None
        yield name, tensor if tensor is not None else safe_file.get_tensor(name)
