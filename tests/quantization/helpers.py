"""Test helpers: load an Octavo model directly, run one prefill, read weights back.

``effective_weight`` recovers the dense weight a linear layer really uses by
applying the layer (its quantization method's real ``apply``) to the
identity matrix, so every format is checked through its compute path.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from octavo.core.attention import AttentionBatch
from octavo.models.layers.attention import ForwardContext
from octavo.models.layers.linear import LinearBase
from octavo.platforms.cpu import CpuPlatform
from octavo.quantization.naming import checkpoint_names
from octavo.runtime.config import WorkerConfig
from octavo.runtime.model_loading import LoadedModel, load_model


def relative_error(out: torch.Tensor, expected: torch.Tensor) -> float:
    """``|out - expected| / |expected|`` (Frobenius norms, in float32)."""
    return float((out.float() - expected.float()).norm() / expected.float().norm())


def switched_on(monkeypatch, module, variable: str, switch):
    """Fixture body: ``variable=1`` for one test, ``switch`` (the module's cached reader of it)
    cleared before and after; yields ``module``."""
    monkeypatch.setenv(variable, "1")
    switch.cache_clear()
    yield module
    switch.cache_clear()


def check_pairs_dispatch(module, gemv, type_name: str, other_type: str, switch: str, monkeypatch) -> None:
    """A GGUF pairs GEMV ``module`` (``gguf_q4k_pairs``, ``gguf_q6k_pairs``), switched on: the layer op
    takes one bfloat16, 8-byte-aligned token of ``type_name`` through ``gemv``, nothing else;
    switched off (``switch=0``), the general one-token GEMV computes it."""
    from octavo.kernels.quant import gguf_triton
    from octavo.kernels.quant.gguf_dequant import GGML_TYPES_BY_NAME, random_gguf_rows

    ggml_type = GGML_TYPES_BY_NAME[type_name]
    raw = random_gguf_rows(type_name, 16, 512, torch.Generator().manual_seed(0))
    x = torch.randn(1, 512).to(torch.bfloat16)
    assert module.takes(x, raw, type_name)
    assert torch.equal(gguf_triton.gguf_linear(x, raw, ggml_type), gemv(x, raw))
    assert not module.takes(x.float(), raw, type_name) and not module.takes(x, raw, other_type)
    assert not module.takes(torch.cat([x, x]), raw, type_name)
    # Activations off 8-byte alignment (a view one value in) go to the general GEMV.
    assert not module.takes(torch.randn(1, 513).to(torch.bfloat16)[:, 1:], raw, type_name)
    monkeypatch.setenv(switch, "0")
    module.pairs_enabled.cache_clear()
    try:
        assert not module.takes(x, raw, type_name)
        assert torch.equal(gguf_triton.gguf_linear(x, raw, ggml_type), gguf_triton.gguf_gemv(x, raw, ggml_type))
    finally:
        module.pairs_enabled.cache_clear()


def load(
    path: Path, quantization: str | None = None, dtype: str = "float32", load_format: str = "auto",
    kv_cache_dtype: str = "auto",
) -> LoadedModel:
    if load_format == "auto":
        load_format = "gguf" if str(path).endswith(".gguf") else "safetensors"
    config = WorkerConfig(
        model_path=str(path), load_format=load_format, dtype=dtype, kv_cache_dtype=kv_cache_dtype, block_size=16,
        max_model_len=256, max_num_batched_tokens=256, max_num_seqs=4, platform="cpu", quantization=quantization,
    )
    return load_model(config, CpuPlatform(), torch.device("cpu"))


@torch.inference_mode()
def prefill_logits(loaded: LoadedModel, token_ids: list[int]) -> torch.Tensor:
    """float32 logits ``[T, V]`` of one prompt, through the paged attention path."""
    num_tokens, block_size = len(token_ids), 16
    num_blocks = -(-num_tokens // block_size)
    batch = AttentionBatch(
        query_start_loc=torch.tensor([0, num_tokens], dtype=torch.int32),
        seq_lens=torch.tensor([num_tokens], dtype=torch.int32),
        block_table=torch.arange(num_blocks, dtype=torch.int32)[None],
        slot_mapping=torch.arange(num_tokens, dtype=torch.int64),
        num_reqs=1, num_actual_tokens=num_tokens, max_query_len=num_tokens, max_seq_len=num_tokens,
    )
    kv_caches = [
        torch.zeros(backend.kv_cache_shape(num_blocks), dtype=backend.spec.kv_cache_dtype)
        for backend in loaded.layer_backends
    ]
    ctx = ForwardContext(attn_metadata=loaded.metadata_builder.build_metadata(batch), kv_caches=kv_caches)
    positions = torch.arange(num_tokens)
    hidden = loaded.model(torch.tensor(token_ids), positions, ctx)
    return loaded.model.compute_logits(hidden).to(torch.float32)


def linear_layers(model: nn.Module) -> dict[str, LinearBase]:
    return {m.prefix: m for m in model.modules() if isinstance(m, LinearBase)}


@torch.inference_mode()
def effective_weight(layer: LinearBase, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[N, K]``: the layer applied to the identity, bias removed."""
    eye = torch.eye(layer.input_size, dtype=dtype)
    out = layer.quant_method.apply(layer, eye)
    if getattr(layer, "bias", None) is not None:
        out = out - layer.bias.to(dtype)
    return out.t().to(torch.float32)


def checkpoint_tensors(checkpoint_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(checkpoint_dir / "model.safetensors"))


def fused_reference(tensors: dict[str, torch.Tensor], prefix: str, suffix: str = "weight") -> torch.Tensor:
    """The checkpoint weight of an Octavo (possibly fused) layer."""
    return torch.cat([tensors[f"{name}.{suffix}"].to(torch.float32) for name in checkpoint_names(prefix)])


def write_config(checkpoint_dir: Path, **updates) -> None:
    path = checkpoint_dir / "config.json"
    config = json.loads(path.read_text())
    config.update(updates)
    path.write_text(json.dumps(config, indent=2))
