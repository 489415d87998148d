"""GGUF linear layers that stay quantized on the device.

``octavo.models.gguf_loader`` describes a GGUF file as a checkpoint whose
``quantization_config`` is ``{"quant_method": "gguf", "raw_modules": {name:
ggml type}}``: the linear modules (checkpoint names, e.g.
``model.layers.0.self_attn.q_proj``) whose weights it yields as raw ggml
rows (uint8 ``[N, row_bytes]``, tensor name ``<module>.qweight``). Every other
tensor is dequantized by the loader into the model dtype.

A fused layer's shards may have different ggml types (llama.cpp's Q4_K_M
gives v_proj Q6_K and q/k Q4_K), so a layer stores its shards one after the
other in one flat byte buffer ``qweight``, each ``[rows, row_bytes]`` of its
own type; ``apply`` runs one dequant-matmul (the ``gguf_linear`` layer op)
per run of same-typed shards and concatenates the outputs. On a GPU the op
is the fused Triton kernel for small batches and Triton dequantization +
dense matmul for large ones; elsewhere its reference, the torch dequantizer
+ matmul.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from octavo.errors import ModelLoadError, QuantizationError
from octavo.kernels.quant.gguf_dequant import GGML_TYPES_BY_NAME, GGMLType
from octavo.quantization.base import LinearMethod, QuantizationConfig, UnquantizedLinearMethod
from octavo.quantization.naming import checkpoint_names
from octavo.quantization.params import new_param, output_rows, shard_index

@dataclass(frozen=True)
class _Segment:
    ggml_type: GGMLType
    rows: int
    row_bytes: int
    byte_offset: int

    @property
    def num_bytes(self) -> int:
        return self.rows * self.row_bytes


class GGUFLinearMethod(LinearMethod):
    def __init__(self, shard_types: list[GGMLType]) -> None:
        self.shard_types = shard_types

    def create_weights(self, layer, input_size, output_partition_sizes, params_dtype, bias):
        if len(output_partition_sizes) != len(self.shard_types):
            raise QuantizationError(f"{layer.prefix}: {len(self.shard_types)} GGUF shards for {len(output_partition_sizes)} outputs")
        segments, offset = [], 0
        for ggml_type, rows in zip(self.shard_types, output_partition_sizes):
            try:
                row_bytes = ggml_type.row_bytes(input_size)
            except ValueError as exc:
                raise QuantizationError(f"{layer.prefix}: {exc}") from None
            segments.append(_Segment(ggml_type, rows, row_bytes, offset))
            offset += rows * row_bytes
        layer.gguf_segments = segments
        qweight = new_param((offset,), torch.uint8)
        qweight.weight_loader = self._loader(layer)
        layer.register_parameter("qweight", qweight)
        layer.register_parameter("bias", new_param((sum(output_partition_sizes),), params_dtype, output_dim=0) if bias else None)

    @staticmethod
    def _loader(layer: nn.Module):
        def load(param: torch.Tensor, loaded: torch.Tensor, shard_id: Any = None) -> None:
            segment = layer.gguf_segments[shard_index(layer, shard_id)]
            _, start, rows = output_rows(layer, shard_id)
            row_split = getattr(layer, "input_size_per_partition", None) is not None and layer.tp_size > 1
            full_row_bytes = segment.row_bytes * (layer.tp_size if row_split else 1)
            if loaded.dtype != torch.uint8 or loaded.dim() != 2 or loaded.shape[1] != full_row_bytes:
                raise ModelLoadError(
                    f"{layer.prefix}: GGUF {segment.ggml_type.name} data of shape {tuple(loaded.shape)} ({loaded.dtype}) "
                    f"does not hold rows of {full_row_bytes} bytes"
                )
            if loaded.shape[0] < start + rows:
                raise ModelLoadError(f"{layer.prefix}: GGUF tensor has {loaded.shape[0]} rows, expected at least {start + rows}")
            block = loaded[start : start + rows]
            if row_split:
                block = block[:, layer.tp_rank * segment.row_bytes : (layer.tp_rank + 1) * segment.row_bytes]
            target = param.data[segment.byte_offset : segment.byte_offset + segment.num_bytes]
            target.view(rows, segment.row_bytes).copy_(block)

        return load

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        outputs, runs = [], _same_type_runs(layer.gguf_segments)
        for ggml_type, first, last in runs:
            start = layer.gguf_segments[first].byte_offset
            end = layer.gguf_segments[last].byte_offset + layer.gguf_segments[last].num_bytes
            rows = sum(s.rows for s in layer.gguf_segments[first : last + 1])
            raw = layer.qweight[start:end].view(rows, -1)
            outputs.append(layer.ops.gguf_linear(x, raw, ggml_type))
        out = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-1)
        return out if layer.bias is None else out + layer.bias


def _same_type_runs(segments: list[_Segment]) -> list[tuple[GGMLType, int, int]]:
    runs: list[tuple[GGMLType, int, int]] = []
    for index, segment in enumerate(segments):
        if runs and runs[-1][0] == segment.ggml_type:
            runs[-1] = (segment.ggml_type, runs[-1][1], index)
        else:
            runs.append((segment.ggml_type, index, index))
    return runs


class GGUFConfig(QuantizationConfig):
    name = "gguf"

    def __init__(self, raw_modules: dict[str, str]) -> None:
        self.raw_modules = raw_modules

    @classmethod
    def from_hf_config(cls, quant_config: dict[str, Any] | None) -> "GGUFConfig":
        if quant_config is None or "raw_modules" not in quant_config:
            raise QuantizationError("gguf quantization applies to .gguf files only (pass the file as the model)")
        return cls(dict(quant_config["raw_modules"]))

    def get_linear_method(self, layer: nn.Module, prefix: str) -> LinearMethod:
        names = checkpoint_names(prefix)
        types = [self.raw_modules.get(name) for name in names]
        if all(t is None for t in types):
            return UnquantizedLinearMethod()
        if any(t is None for t in types):
            raise QuantizationError(f"{prefix}: some of {', '.join(names)} are missing from the GGUF file")
        return GGUFLinearMethod([GGML_TYPES_BY_NAME[t] for t in types])
