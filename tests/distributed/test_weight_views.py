"""Each rank reads only its slices of the checkpoint.

A tensor-parallel rank (rank 1 of 2) and a pipeline stage (stage 1 of 2) are
built in this process with stand-in groups (loading needs no collective).
Their parameters hold exactly their slices, equal to what a full read gives;
and, with the file dropped from the page cache and readahead off, the pages
of the file that loading touched are those slices' pages only.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import types

import numpy as np
import pytest
import torch

from octavo.distributed import weight_views
from octavo.distributed.parallel_state import GroupInfo, reset_groups, set_groups
from octavo.models.loader import iterate_safetensors
from octavo.platforms.cpu import CpuPlatform
from octavo.runtime.config import WorkerConfig
from octavo.runtime.model_loading import load_model
from tests.checkpoints import build_checkpoint

PAGE = mmap.PAGESIZE


@pytest.fixture(scope="module")
def wide_llama(tmp_path_factory, tokenizer_dir):
    # Tensors of 128-512 KiB, so that halves span many pages.
    return build_checkpoint(
        tmp_path_factory.mktemp("wide") / "llama", "llama", tokenizer_dir, hidden_size=256, intermediate_size=512
    )


def load_as(path, tp_rank: int, tp_size: int, pp_rank: int, pp_size: int):
    set_groups(
        GroupInfo(tp_rank, tp_size, None, tuple(range(tp_size))),
        GroupInfo(pp_rank, pp_size, None, tuple(range(pp_size))),
    )
    try:
        config = WorkerConfig(
            str(path), "safetensors", "float32", "auto", 16, 256, 64, 4, "cpu",
            tensor_parallel_size=tp_size, pipeline_parallel_size=pp_size,
        )
        return load_model(config, CpuPlatform(), torch.device("cpu")).model
    finally:
        reset_groups()


def full_tensors(path) -> dict[str, torch.Tensor]:
    return dict(iterate_safetensors([path / "model.safetensors"]))


def test_views_are_zero_copy(wide_llama):
    file = wide_llama / "model.safetensors"
    data_start, header = weight_views.read_header(file)
    views = dict(weight_views.iterate_safetensors_views([file]))
    first, second = sorted(header, key=lambda n: header[n]["data_offsets"][0])[:2]
    distance = views[second].data_ptr() - views[first].data_ptr()
    assert distance == header[second]["data_offsets"][0] - header[first]["data_offsets"][0]
    assert torch.equal(views[second], full_tensors(wide_llama)[second])


@pytest.mark.parametrize("tp_rank,tp_size,pp_rank,pp_size", [(1, 2, 0, 1), (0, 1, 1, 2)], ids=["tp-rank1", "pp-stage1"])
def test_rank_holds_exactly_its_slices(wide_llama, tp_rank, tp_size, pp_rank, pp_size):
    model = load_as(wide_llama, tp_rank, tp_size, pp_rank, pp_size)
    full = full_tensors(wide_llama)
    params = dict(model.named_parameters())
    layer = 1 if pp_size == 2 else 0
    assert ("model.layers.0.mlp.down_proj.weight" in params) == (pp_rank == 0)
    q = params[f"model.layers.{layer}.self_attn.qkv_proj.weight"][:128 // tp_size]
    assert torch.equal(q, full[f"model.layers.{layer}.self_attn.q_proj.weight"].chunk(tp_size)[tp_rank][: 128 // tp_size])
    down = params[f"model.layers.{layer}.mlp.down_proj.weight"]
    assert torch.equal(down, full[f"model.layers.{layer}.mlp.down_proj.weight"].chunk(tp_size, dim=1)[tp_rank])
    # The same parameters as a full read narrowed by the same loaders.
    snapshot = {name: p.detach().clone() for name, p in params.items()}
    set_groups(GroupInfo(tp_rank, tp_size, None, tuple(range(tp_size))), GroupInfo(pp_rank, pp_size, None, tuple(range(pp_size))))
    try:
        model.load_weights(iterate_safetensors([wide_llama / "model.safetensors"]))
    finally:
        reset_groups()
    assert all(torch.equal(snapshot[name], p) for name, p in model.named_parameters())


def _resident_pages(file) -> np.ndarray:
    libc = ctypes.CDLL(None, use_errno=True)
    size = os.path.getsize(file)
    with open(file, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    array = np.frombuffer(mapped, dtype=np.uint8)
    vector = (ctypes.c_ubyte * ((size + PAGE - 1) // PAGE))()
    assert libc.mincore(ctypes.c_void_p(array.ctypes.data), ctypes.c_size_t(size), vector) == 0
    resident = np.frombuffer(vector, dtype=np.uint8) & 1
    del array
    mapped.close()
    return resident


def _pages(data_start: int, entry: dict, fraction=(0.0, 1.0)) -> slice:
    """The pages wholly inside a fraction of a tensor's bytes."""
    begin, end = entry["data_offsets"]
    lo = data_start + begin + int((end - begin) * fraction[0])
    hi = data_start + begin + int((end - begin) * fraction[1])
    return slice(-(-lo // PAGE), hi // PAGE)


def test_only_the_slices_pages_are_read(wide_llama, tmp_path, monkeypatch):
    file = tmp_path / "model.safetensors"
    file.write_bytes((wide_llama / "model.safetensors").read_bytes())
    for name in ("config.json", "generation_config.json"):
        if (wide_llama / name).exists():
            (tmp_path / name).write_bytes((wide_llama / name).read_bytes())
    fd = os.open(file, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    if _resident_pages(file).any():
        pytest.skip("this filesystem keeps the file in memory (fadvise DONTNEED had no effect): cannot observe reads")

    def mmap_without_readahead(*args, **kwargs):
        mapped = mmap.mmap(*args, **kwargs)
        mapped.madvise(mmap.MADV_RANDOM)  # pages are read only when touched
        return mapped

    monkeypatch.setattr(weight_views, "mmap", types.SimpleNamespace(mmap=mmap_without_readahead, ACCESS_COPY=mmap.ACCESS_COPY))
    load_as(tmp_path, tp_rank=1, tp_size=2, pp_rank=1, pp_size=2)
    resident = _resident_pages(file)
    data_start, header = weight_views.read_header(file)
    # Stage 0's layer: never touched.
    for name, entry in header.items():
        if name.startswith("model.layers.0."):
            assert not resident[_pages(data_start, entry)].any(), name
    # Stage 1's layer, TP rank 1: output-split rows of the first rank untouched, its own read.
    for name in ("q_proj", "k_proj", "v_proj"):
        entry = header[f"model.layers.1.self_attn.{name}.weight"]
        assert not resident[_pages(data_start, entry, (0.0, 0.5))].any(), name
        assert resident[_pages(data_start, entry, (0.5, 1.0))].all(), name
    for name in ("gate_proj", "up_proj"):
        entry = header[f"model.layers.1.mlp.{name}.weight"]
        assert not resident[_pages(data_start, entry, (0.0, 0.5))].any(), name
        assert resident[_pages(data_start, entry, (0.5, 1.0))].all(), name
