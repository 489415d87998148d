"""Build the model for a worker: architecture, quantization, layer ops, backend, weights.

The layer ops are resolved once here, for this model's dtype on this
device, and the model is constructed inside their scope: every layer keeps
the table it was built with (nothing is set on a module afterwards).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from octavo.core.attention import AttentionBackend, AttentionSpec
from octavo.core.pooling_params import PoolerConfig
from octavo.core.tokenizer import eos_token_ids
from octavo.errors import ModelLoadError
from octavo.lora.layer import LinearLoRA, LoRABuildScope, LoRAShape, LoRAStepInputs, lora_build_scope
from octavo.models.base import ModelInitContext
from octavo.models.config import ModelArchConfig, load_arch_config, load_generation_config
from octavo.models.layers.attention import Attention
from octavo.models.loader import (
    initialize_dummy_weights,
    iterate_safetensors,
    process_weights_after_loading,
    safetensors_files,
)
from octavo.models.pooling_config import build_pooler_config
from octavo.models.registry import resolve_model_class
from octavo.ops import LayerOps, layer_ops_scope, resolve_layer_ops
from octavo.ops.resolution import log_layer_ops
from octavo.platforms.interface import Platform
from octavo.quantization.memory import log_weight_memory
from octavo.quantization.registry import build_quant_config
from octavo.runtime.config import WorkerConfig, dtype_from_name
from octavo.runtime.startup import timed_phase


@dataclass
class LoadedModel:
    model: nn.Module
    arch: ModelArchConfig
    # Global layer index -> that layer's backend, for the layers this rank holds.
    layer_backends_by_index: dict[int, AttentionBackend]
    eos_token_ids: frozenset[int]
    weight_bytes: int
    ops: LayerOps | None = None
    # Set for pooling models (embeddings, classification).
    pooler: PoolerConfig | None = None
    # With LoRA on: every LoRA layer by prefix, and the step's slot inputs they share.
    lora_layers: dict[str, LinearLoRA] | None = None
    lora_inputs: LoRAStepInputs | None = None

    @property
    def uses_kv_cache(self) -> bool:
        """False for encoder-only models: they attend within the step's tokens."""
        return self.pooler is None or not self.pooler.is_encoder

    @property
    def layer_backends(self) -> list[AttentionBackend]:
        return [self.layer_backends_by_index[i] for i in sorted(self.layer_backends_by_index)]

    @property
    def metadata_builder(self) -> AttentionBackend:
        return self.layer_backends[0]


def _backend_factory(platform: Platform):
    cache: dict[AttentionSpec, AttentionBackend] = {}

    def factory(spec: AttentionSpec) -> AttentionBackend:
        if spec not in cache:
            cache[spec] = platform.attention_backend(spec)
        return cache[spec]

    return factory


def weight_bytes(model: nn.Module) -> int:
    seen, total = set(), 0
    for tensor in list(model.parameters()) + list(model.buffers()):
        # Lazy-tensor devices (XLA) report no data pointer: count those by object.
        key = tensor.data_ptr() or id(tensor)
        if key in seen:
            continue
        seen.add(key)
        total += tensor.numel() * tensor.element_size()
    return total


def load_arch(config: WorkerConfig) -> tuple[ModelArchConfig, dict]:
    path = Path(config.model_path)
    if config.load_format == "gguf":
        from octavo.models.gguf_loader import gguf_arch_config

        return gguf_arch_config(path), {}
    return load_arch_config(path, config.hf_overrides), load_generation_config(path)


def _load_weights(model: nn.Module, config: WorkerConfig, arch: ModelArchConfig) -> None:
    if config.load_format == "dummy":
        initialize_dummy_weights(model, seed=config.seed)
    elif config.load_format == "gguf":
        from octavo.models.gguf_loader import iterate_gguf_tensors

        model.load_weights(iterate_gguf_tensors(Path(config.model_path), arch))
    elif config.load_format in ("safetensors", "auto"):
        model.load_weights(safetensors_tensors(config, Path(config.model_path)))
    else:
        raise ModelLoadError(f"unknown load_format {config.load_format!r} (auto, safetensors, dummy, gguf)")


def safetensors_tensors(config: WorkerConfig, model_dir: Path):
    """The checkpoint's tensors as this rank reads them: memory-mapped views
    where several ranks share the model (each reads only its slices and layers)."""
    reader = iterate_safetensors
    if config.tensor_parallel_size * config.pipeline_parallel_size > 1:
        from octavo.distributed.weight_views import iterate_safetensors_views as reader
    return reader(safetensors_files(model_dir))


def load_model(
    config: WorkerConfig, platform: Platform, device: torch.device, model_class: type[nn.Module] | None = None
) -> LoadedModel:
    """The model of ``config``, built as ``model_class`` if given (else the
    registry's class for its architecture and task)."""
    arch, generation_config = load_arch(config)
    model_class = model_class or resolve_model_class(arch.architecture, config.task)
    pooler = None
    if config.task != "generate":
        pooler = build_pooler_config(config.task, arch, Path(config.model_path), model_class)
    quant_config = build_quant_config(config.quantization, arch.quantization_config, platform)
    dtype = dtype_from_name(config.dtype)
    kv_cache_dtype = dtype if config.kv_cache_dtype == "auto" else platform.kv_cache_dtype(config.kv_cache_dtype)
    ops = resolve_layer_ops(platform, device, dtype)
    log_layer_ops(ops, platform.name, dtype)
    ctx = ModelInitContext(
        config=arch,
        dtype=dtype,
        quant_config=quant_config,
        attention_backend=_backend_factory(platform),
        max_model_len=config.max_model_len,
        block_size=config.block_size,
        kv_cache_dtype=kv_cache_dtype,
        expert_parallel=config.enable_expert_parallel,
        ops=ops,
        pooler=pooler,
    )
    if config.max_loras > 0 and not getattr(model_class, "supports_lora", True):
        raise ModelLoadError(f"LoRA adapters are not supported for {arch.architecture} yet")
    lora = _lora_scope(config, pooler, dtype, device)
    with timed_phase("build model"), torch.device(device), layer_ops_scope(ops), lora_build_scope(lora):
        model = model_class(ctx)
    with timed_phase(f"load weights ({config.load_format})"):
        _load_weights(model, config, arch)
        process_weights_after_loading(model)
    log_weight_memory(model, quant_config.name if quant_config is not None else None)
    with timed_phase("optimize model"):
        platform.optimize_model(model)  # plugin API 1.0; layer ops are the way to bring kernels
    model.eval()
    backends = {m.layer_index: m.backend for m in model.modules() if isinstance(m, Attention)}
    return LoadedModel(
        model=model,
        arch=arch,
        layer_backends_by_index=backends,
        eos_token_ids=eos_token_ids(None, arch.raw, generation_config),
        weight_bytes=weight_bytes(model),
        ops=ops,
        pooler=pooler,
        lora_layers=lora.layers if lora is not None else None,
        lora_inputs=lora.inputs if lora is not None else None,
    )


def _lora_scope(config: WorkerConfig, pooler: PoolerConfig | None, dtype: torch.dtype, device) -> LoRABuildScope | None:
    """The scope that gives the model's linear layers LoRA slots (None: LoRA off)."""
    if config.max_loras <= 0:
        return None
    if pooler is not None:
        raise ModelLoadError("LoRA adapters are served for text generation only, not for pooling models")
    # As many rows as the runner's input buffers have tokens (padded steps included).
    max_tokens = max(config.max_num_batched_tokens, config.max_num_seqs)
    shape = LoRAShape(config.max_loras, config.max_lora_rank)
    return LoRABuildScope(LoRAStepInputs(max_tokens, shape, dtype, torch.device(device)))
