"""Weight memory of a model, split into linear layers and the rest.

The ratio quantization is judged by is computed over the linear layers only
(attention and MLP projections): their bytes after loading (quantized
weights, scales, zero points, permutations) over the bytes the same layers
take in bfloat16 (``2 * inputs * outputs``). Embeddings, norms and the LM
head are reported separately; they stay in the model dtype in every format.

``measure_weight_memory`` builds the model on PyTorch's ``meta`` device
(shapes, no data), runs the quantization methods' post-load processing
there and counts bytes, so ``octavo env --model`` sizes an 8B model in
seconds without loading it (``build_meta_model``; ``octavo bench`` counts
its floors from the same build). ``weight_memory_of`` counts a loaded model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from octavo.models.config import ModelArchConfig

logger = logging.getLogger(__name__)


@dataclass
class WeightMemory:
    total_bytes: int
    linear_bytes: int
    linear_bf16_bytes: int
    # Logical parameters (a quantized weight counts its unpacked values), and
    # those one token multiplies: for MoE only its top-k experts of each layer.
    num_params: int = 0
    num_active_params: int = 0
    expert_bytes: int = 0  # routed experts (MoE), not counted as linear layers

    @property
    def other_bytes(self) -> int:
        return self.total_bytes - self.linear_bytes - self.expert_bytes

    @property
    def linear_ratio(self) -> float:
        """Linear-layer bytes over the same layers in bfloat16."""
        return self.linear_bytes / self.linear_bf16_bytes if self.linear_bf16_bytes else 1.0

    def describe(self, quantization: str | None) -> str:
        params = f"{self.num_params / 1e9:.2f} B parameters"
        if self.num_active_params != self.num_params:
            params += f", {self.num_active_params / 1e9:.2f} B active per token"
        return (
            f"{params}; weights {_size(self.total_bytes)} ({quantization or 'unquantized'}): "
            f"linear layers {_size(self.linear_bytes)} = {self.linear_ratio:.3f} x bf16 "
            f"({_size(self.linear_bf16_bytes)}), "
            + (f"experts {_size(self.expert_bytes)}, " if self.expert_bytes else "")
            + f"embeddings/norms/LM head {_size(self.other_bytes)}"
        )


def _size(num_bytes: int) -> str:
    if num_bytes >= 2**30:
        return f"{num_bytes / 2**30:.2f} GiB"
    return f"{num_bytes / 2**20:.2f} MiB"


def _tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def weight_memory_of(model: nn.Module) -> WeightMemory:
    from octavo.models.layers.linear import LinearBase

    seen: set[int] = set()
    total = linear = linear_bf16 = params = inactive = experts_size = 0
    for module in model.modules():
        # Parameters only: buffers hold caches (rotary tables), not weights.
        own = [t for t in module.parameters(recurse=False) if id(t) not in seen]
        seen.update(id(t) for t in own)
        size = _tensor_bytes(own)
        total += size
        if isinstance(module, LinearBase):
            linear += size
            in_features = getattr(module, "input_size_per_partition", module.input_size)
            linear_bf16 += 2 * in_features * sum(module.output_partition_sizes)
            outputs = sum(module.output_partition_sizes)
            params += in_features * outputs + (outputs if getattr(module, "bias", None) is not None else 0)
            continue
        count = sum(t.numel() for t in own)
        params += count
        experts, top_k = getattr(module, "num_experts", None), getattr(module, "num_experts_per_tok", None)
        if isinstance(experts, int) and isinstance(top_k, int):  # routed experts: a token uses top_k
            inactive += count - count * top_k // experts
            experts_size += size
    return WeightMemory(total, linear, linear_bf16, params, params - inactive, experts_size)


def measure_weight_memory(model_path: str, quantization: str | None = None, dtype: str = "bfloat16") -> WeightMemory:
    """Weight memory of ``model_path`` (checkpoint directory or .gguf file)
    as Octavo would load it, measured without reading the weights."""
    return weight_memory_of(build_meta_model(model_path, quantization, dtype)[0])


def build_meta_model(model_path: str, quantization: str | None = None, dtype: str = "bfloat16") -> tuple[nn.Module, "ModelArchConfig"]:
    """The model as Octavo would load it, on the ``meta`` device (every
    parameter with its loaded shape and dtype, after the quantization
    method's post-load processing; no data), and its architecture config."""
    from pathlib import Path

    from octavo.models.base import ModelInitContext
    from octavo.models.loader import process_weights_after_loading, resolve_model_path
    from octavo.models.registry import build_registry
    from octavo.plugins.selection import select_platform
    from octavo.quantization.registry import build_quant_config
    from octavo.runtime.config import WorkerConfig, dtype_from_name
    from octavo.runtime.model_loading import load_arch

    path = resolve_model_path(model_path)
    load_format = "gguf" if Path(path).suffix == ".gguf" else "safetensors"
    platform = select_platform(None).platform
    config = WorkerConfig(
        model_path=str(path), load_format=load_format, dtype=dtype, kv_cache_dtype="auto", block_size=16,
        max_model_len=16, max_num_batched_tokens=16, max_num_seqs=1, platform=platform.name, quantization=quantization,
    )
    arch, _ = load_arch(config)
    quant_config = build_quant_config(quantization, arch.quantization_config, platform)
    from octavo.runtime.attention.torch_paged import TorchPagedAttention

    ctx = ModelInitContext(
        config=arch, dtype=dtype_from_name(dtype), quant_config=quant_config,
        attention_backend=TorchPagedAttention, max_model_len=16, block_size=16, kv_cache_dtype=dtype_from_name(dtype),
    )
    with torch.device("meta"):
        model = build_registry().resolve(arch.architecture)(ctx)
        process_weights_after_loading(model)
    return model, arch


def log_weight_memory(model: nn.Module, quantization: str | None) -> None:
    logger.info("%s", weight_memory_of(model).describe(quantization))
