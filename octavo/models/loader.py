"""Finding a checkpoint and loading its weights: safetensors only.

Weights are read through ``safetensors.safe_open`` (memory-mapped, one tensor
at a time), from a single ``model.safetensors`` or a sharded index. Pickle
formats (``.bin``, ``.pt``) are refused: they can run code when loaded.
``load_format="dummy"`` fills parameters with random values instead (for
benchmarks at real shapes without real weights).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from octavo.errors import ModelLoadError
from octavo.models.layers.attention import KV_SCALE_NAMES
from octavo.models.weight_loading import mark_adoptable

logger = logging.getLogger(__name__)


def resolve_model_path(model: str | Path) -> Path:
    """A local checkpoint directory (or GGUF file) for ``model``: a path, or a
    Hub id, downloaded into the Hub cache (``octavo.models.hub``)."""
    from octavo.models.hub import resolve_model

    return resolve_model(str(model))


def safetensors_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"{index} is not a valid safetensors index: {exc}") from exc
        files = sorted({model_dir / name for name in weight_map.values()})
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise ModelLoadError(f"shard {missing[0]} listed in {index.name} is missing")
        return files
    files = sorted(model_dir.glob("*.safetensors"))
    if files:
        return files
    pickled = sorted(p.name for p in model_dir.glob("*") if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
    if pickled:
        raise ModelLoadError(
            f"{model_dir} holds only pickle weights ({pickled[0]}); Octavo loads safetensors only. "
            "Convert them with transformers' save_pretrained(safe_serialization=True)."
        )
    raise ModelLoadError(f"{model_dir} holds no *.safetensors weights")


def iterate_safetensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    from octavo.models.safetensors_map import iterate_mapped

    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                # Copy-on-write views of one mapping of the file: a parameter may keep one.
                for name, tensor in iterate_mapped(file, f):
                    yield name, mark_adoptable(tensor)
        except ModelLoadError:
            raise
        except Exception as exc:  # SafetensorError, OSError, ...
            raise ModelLoadError(f"could not read {file.name}: {exc}") from exc


def initialize_dummy_weights(model: nn.Module, seed: int = 0, scale: float = 1e-3) -> None:
    """Random values at the parameters' shapes, drawn on their device; norms stay 1."""
    generators: dict[torch.device, torch.Generator] = {}
    for name, param in model.named_parameters():
        data = param.data
        generator = generators.get(data.device)
        if generator is None:
            generator = generators[data.device] = torch.Generator(device=data.device).manual_seed(seed)
        if name.endswith("norm.weight") or name.rpartition(".")[2] in KV_SCALE_NAMES:
            data.fill_(1.0)
        elif data.dtype in (torch.float32, torch.float16, torch.bfloat16):
            data.uniform_(-scale, scale, generator=generator)
        elif data.is_floating_point():  # fp8 and friends: draw in fp32, then cast
            data.copy_(torch.empty(data.shape, device=data.device).uniform_(-scale, scale, generator=generator))
        else:
            info = torch.iinfo(data.dtype)
            low, high = max(info.min, -(2**31)), min(info.max, 2**31 - 1)
            data.copy_(torch.randint(low, high, data.shape, generator=generator, device=data.device))


def process_weights_after_loading(model: nn.Module) -> None:
    """Quantization methods repack their layers; attention layers hand their
    KV-cache scales to the backend."""
    from octavo.models.layers.attention import Attention

    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(module)
        elif isinstance(module, Attention):
            module.apply_kv_scales(name)
