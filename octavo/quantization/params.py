"""Parameter helpers shared by the quantization methods.

Linear layers (``octavo.models.layers.linear``) slice checkpoint tensors by
the loader hints on each parameter; these helpers add what the hints cannot
say: a scale that is per-tensor in one checkpoint and per-channel in another,
a tensor stored once per fused shard (``g_idx``), and the bookkeeping of
which parameters a checkpoint really provided. Loaders defined here reshape
the checkpoint tensor and hand it to the layer's own ``weight_loader``, so
tensor-parallel slicing stays in one place.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from octavo.errors import ModelLoadError
from octavo.quantization.base import set_weight_attrs


def new_param(shape: tuple[int, ...] | list[int], dtype: torch.dtype, **attrs: Any) -> nn.Parameter:
    param = nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)
    set_weight_attrs(param, **attrs)
    return param


def create_channel_scaled_weights(
    layer: nn.Module,
    input_size: int,
    output_partition_sizes: list[int],
    params_dtype: torch.dtype,
    bias: bool,
    serialized_dtype: torch.dtype | None,
) -> None:
    """``weight`` (+ ``bias``) for an 8-bit method: in ``serialized_dtype`` with a
    per-channel ``weight_scale`` when the checkpoint is already quantized
    (``serialized_dtype`` given), else in the model dtype, quantized after loading."""
    num_out = sum(output_partition_sizes)
    dtype = serialized_dtype or params_dtype
    layer.register_parameter("weight", new_param((num_out, input_size), dtype, output_dim=0, input_dim=1))
    if serialized_dtype is not None:
        scale = new_param((num_out,), torch.float32, output_dim=0)
        scale.weight_loader = channel_scale_loader(layer)
        layer.register_parameter("weight_scale", scale)
    layer.register_parameter("bias", new_param((num_out,), params_dtype, output_dim=0) if bias else None)


def replace_param(layer: nn.Module, name: str, value: torch.Tensor | None) -> None:
    """Swap a parameter for a new tensor (freeing the old one); None removes it."""
    if name in layer._parameters:
        del layer._parameters[name]
    if value is None:
        layer.register_parameter(name, None)
        return
    param = nn.Parameter(value, requires_grad=False)
    param.not_in_checkpoint = True  # made after loading
    layer.register_parameter(name, param)


def shard_index(layer: nn.Module, shard_id: Any) -> int:
    if shard_id is None:
        return 0
    return layer._shard_index(shard_id)


def output_rows(layer: nn.Module, shard_id: Any) -> tuple[int, int, int]:
    """(offset in this rank's parameter, start in the checkpoint tensor, rows)
    of the output rows that ``shard_id`` of ``layer`` holds on this rank."""
    if hasattr(layer, "_shard_offset_and_rank_slice"):
        return layer._shard_offset_and_rank_slice(shard_id)
    return 0, 0, layer.output_size  # row-parallel or replicated: outputs not split


def rank_input_slice(layer: nn.Module, loaded: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """This rank's part of a tensor whose ``dim`` runs over input features."""
    if getattr(layer, "input_size_per_partition", None) is None or layer.tp_size == 1:
        return loaded
    if loaded.shape[dim] < (layer.tp_rank + 1) * size:
        raise ModelLoadError(f"{layer.prefix}: checkpoint tensor of shape {tuple(loaded.shape)} is too small along dim {dim}")
    return loaded.narrow(dim, layer.tp_rank * size, size)


def mark_loaded(layer: nn.Module, name: str, index: int = 0) -> None:
    loaded = layer.__dict__.setdefault("_quant_loaded", set())
    loaded.add((name, index))


def was_loaded(layer: nn.Module, name: str, index: int = 0) -> bool:
    return (name, index) in layer.__dict__.get("_quant_loaded", set())


def channel_scale_loader(layer: nn.Module, name: str = "weight_scale"):
    """A loader for a float32 ``[N]`` scale that accepts a per-tensor scale
    (one value, broadcast over the shard's rows) or a per-channel one
    (``[rows]`` or ``[rows, 1]``). Fused layers whose shards have different
    per-tensor scales thus keep each shard's scale exactly."""

    def load(param: torch.Tensor, loaded: torch.Tensor, shard_id: Any = None) -> None:
        loaded = loaded.to(torch.float32)
        if loaded.numel() == 1:
            offset, _, size = output_rows(layer, shard_id)
            param.data[offset : offset + size].copy_(loaded.reshape(1).expand(size))
        else:
            if loaded.dim() == 2 and loaded.shape[1] == 1:
                loaded = loaded[:, 0]
            if loaded.dim() != 1:
                raise ModelLoadError(
                    f"{layer.prefix}.{name}: expected a per-tensor or per-channel scale, got shape {tuple(loaded.shape)}"
                )
            layer.weight_loader(param, loaded, shard_id)
        mark_loaded(layer, name, shard_index(layer, shard_id))

    return load


def per_shard_loader(layer: nn.Module, name: str):
    """A loader for a ``[num_shards, K]`` parameter holding one input-indexed
    vector per fused shard (GPTQ's ``g_idx``)."""

    def load(param: torch.Tensor, loaded: torch.Tensor, shard_id: Any = None) -> None:
        index = shard_index(layer, shard_id)
        loaded = rank_input_slice(layer, loaded.reshape(-1), 0, param.shape[1])
        if loaded.shape[0] != param.shape[1]:
            raise ModelLoadError(f"{layer.prefix}.{name}: checkpoint tensor has {loaded.shape[0]} entries, expected {param.shape[1]}")
        param.data[index].copy_(loaded)
        mark_loaded(layer, name, index)

    return load


def tracking_loader(layer: nn.Module, name: str):
    """The layer's own loader, noting which shards were loaded."""

    def load(param: torch.Tensor, loaded: torch.Tensor, shard_id: Any = None) -> None:
        layer.weight_loader(param, loaded, shard_id)
        mark_loaded(layer, name, shard_index(layer, shard_id))

    return load
