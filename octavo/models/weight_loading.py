"""Copying checkpoint tensors into a model's parameters, by name.

A model says how a checkpoint name maps onto its own parameters (a
``rename`` function: ``(parameter name, shard id)`` or None to skip the
tensor); parameters with a ``weight_loader`` (parallel and fused layers) get
the tensor through it, others are copied after a shape check. Every
parameter must end up loaded (every shard of a fused one, every shard id a
parameter's ``required_shard_ids`` lists), or loading fails with the first
one missing: a half-loaded model never serves.

On the CPU a parameter whose checkpoint tensor has its exact layout takes
that tensor instead of a copy (``fill_parameter``): the safetensors reader's
tensors are copy-on-write views of the memory-mapped file, so the weights'
pages are the page cache's until written. Copying cost more in page faults
on the freshly allocated parameter than in the copy itself (docs/startup.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from octavo.errors import ModelLoadError

Rename = Callable[[str], tuple[str, object] | None]

# Set on tensors that no one but the loading model will hold (the safetensors
# reader's fresh views of the mapped file): a parameter may keep such a tensor.
ADOPTABLE = "octavo_adoptable"


def mark_adoptable(tensor: torch.Tensor) -> torch.Tensor:
    setattr(tensor, ADOPTABLE, True)
    return tensor


def fill_parameter(param: torch.Tensor, loaded: torch.Tensor) -> None:
    """``param.data.copy_(loaded)``, or, for a whole CPU parameter and an
    adoptable tensor of its dtype, shape and layout, ``param.data = loaded``."""
    adopt = (
        isinstance(param, nn.Parameter) and getattr(loaded, ADOPTABLE, False)
        and param.device.type == "cpu" and loaded.device.type == "cpu"
        and param.dtype == loaded.dtype and param.shape == loaded.shape
        and param.is_contiguous() and loaded.is_contiguous()
    )
    if adopt:
        param.data = loaded
    else:
        param.data.copy_(loaded)


# On a fused CPU parameter, once a shard has been loaded: the (first row,
# rows) of each shard whose bytes the parameter views in the mapped file
# (empty once the parameter has memory of its own).
PLACED_SHARDS = "octavo_placed_shards"


def _shard_fits(param: torch.Tensor, loaded: torch.Tensor) -> bool:
    return (
        isinstance(param, nn.Parameter) and getattr(loaded, ADOPTABLE, False)
        and param.device.type == "cpu" and loaded.device.type == "cpu" and param.dtype == loaded.dtype
        and param.dim() > 0 and param.shape[0] > 0 and param.shape[1:] == loaded.shape[1:]
        and param.is_contiguous() and loaded.is_contiguous()
    )


def place_shard(param: torch.Tensor, loaded: torch.Tensor, row: int) -> bool:
    """Put shard ``loaded`` at row ``row`` of the fused CPU ``param`` without
    a copy where the mapped file already holds it there; False: copy it.

    The first shard loaded, if it is the parameter's first rows, makes the
    parameter a view of the file from that shard's start (the rest of the
    view is whatever the file holds next: a Llama's ``up_proj`` after its
    ``gate_proj``); a later shard is in place only if the file holds it
    exactly where the view expects it. One that is not moves the parameter
    into memory of its own first, taking the rows in place with it, so a
    write never reaches another tensor's bytes."""
    placed = getattr(param, PLACED_SHARDS, None)
    fits = _shard_fits(param, loaded)
    if placed is None:  # the first shard loaded
        storage, start = loaded.untyped_storage(), loaded.storage_offset()
        view = fits and row == 0 and start * loaded.element_size() + param.nbytes <= storage.nbytes()
        if view:
            param.data = torch.empty(0, dtype=param.dtype).set_(storage, start, param.shape)
        setattr(param, PLACED_SHARDS, [(0, loaded.shape[0])] if view else [])
        return bool(view)
    in_place = (
        fits and placed and param.untyped_storage().data_ptr() == loaded.untyped_storage().data_ptr()
        and loaded.data_ptr() == param.data_ptr() + row * (param.nbytes // param.shape[0])
    )
    if in_place:
        placed.append((row, loaded.shape[0]))
        return True
    if placed:
        own = torch.empty(param.shape, dtype=param.dtype)
        for first, rows in placed:
            own[first : first + rows].copy_(param.data[first : first + rows])
        param.data = own
        placed.clear()
    return False


def load_named_tensors(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]], rename: Rename) -> set[str]:
    """Load ``weights``; returns ``name`` or ``name:shard`` for each one loaded."""
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded: set[str] = set()
    for name, tensor in weights:
        renamed = rename(name)
        if renamed is None:
            continue
        target, shard_id = renamed
        param = params.get(target)
        if param is None:
            continue  # another pipeline stage's layer, or a tensor this model does not use
        loader = getattr(param, "weight_loader", None)
        if loader is None:
            if param.shape != tensor.shape:
                raise ModelLoadError(f"{name}: shape {tuple(tensor.shape)} but expected {tuple(param.shape)}")
            fill_parameter(param, tensor)
        elif shard_id is None:
            loader(param, tensor)
        else:
            loader(param, tensor, shard_id)
        # A loader that fills several shards from one tensor (all experts stacked) names them.
        covers = getattr(param, "shards_loaded_by", None)
        shards = covers(param, shard_id) if covers is not None and shard_id is not None else [shard_id]
        loaded.update(target if s is None else f"{target}:{s}" for s in shards)
    return loaded


def check_all_loaded(
    model: nn.Module, loaded: set[str], fused_shards: dict[str, tuple], skip: Callable[[str], bool] | None = None
) -> None:
    """Raise for the first parameter (or fused shard) the checkpoint did not
    provide; ``skip`` names parameters it need not (a head tied to the embedding)."""
    for name, param in model.named_parameters(remove_duplicate=False):
        if getattr(param, "not_in_checkpoint", False):
            continue  # made by a quantization method after loading
        if skip is not None and skip(name):
            continue
        listed = getattr(param, "required_shard_ids", None)  # e.g. this rank's experts
        fused = next((f for f in fused_shards if f".{f}." in f".{name}"), None)
        if listed is not None:
            required = [f"{name}:{s}" for s in listed(param)]
        else:
            required = [f"{name}:{s}" for s in fused_shards[fused]] if fused else [name]
        missing = [r for r in required if r not in loaded]
        if missing:
            raise ModelLoadError(f"the checkpoint has no tensor for {missing[0]}")
