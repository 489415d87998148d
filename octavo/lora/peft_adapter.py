"""Reading a PEFT LoRA adapter directory: ``adapter_config.json`` and
``adapter_model.safetensors`` (pickled ``adapter_model.bin`` is refused).

``check_adapter`` validates an adapter against the model's LoRA targets
(module name -> (in, out) sizes, from the workers) by reading the config
and the safetensors header only: the engine runs it before a request with
a new adapter is queued, so that nothing a worker loads later can fail on
the adapter's shape. ``load_adapter`` reads the tensors (in the worker) and
folds each module's scaling (``lora_alpha / r``, or ``/ sqrt(r)`` with
rsLoRA; ``alpha_pattern`` per module) into its ``B``.

What changes the output and is not implemented is refused, naming it: DoRA,
trained biases, ``modules_to_save``, embedding or LM-head adapters, modules
the model has no LoRA for.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from octavo.errors import LoRAAdapterError

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_PICKLED = ("adapter_model.bin", "adapter_model.pt")
# PEFT saves tensors as "base_model.model.<module>.lora_A.weight" (older
# versions keep the adapter's name: "lora_A.default.weight").
_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<kind>[AB])(?:\.[^.]+)?\.weight$")

# A target's whole (unsharded) input and output sizes.
Targets = dict[str, tuple[int, int]]


@dataclass
class AdapterModule:
    """One module's update: ``lora_a`` [rank, in], ``lora_b`` [out, rank] (scaled)."""

    name: str
    lora_a: torch.Tensor
    lora_b: torch.Tensor


@dataclass(frozen=True)
class AdapterInfo:
    """What ``check_adapter`` found: the modules and the adapter's largest rank."""

    modules: tuple[str, ...]
    max_rank: int


def _fail(path: Path, message: str) -> LoRAAdapterError:
    return LoRAAdapterError(f"LoRA adapter {path}: {message}", param="lora_request")


def read_config(path: Path) -> dict:
    config_file = path / CONFIG_FILE
    if not config_file.is_file():
        raise _fail(path, f"no {CONFIG_FILE} (a PEFT LoRA adapter directory is expected)")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise _fail(path, f"{CONFIG_FILE} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise _fail(path, f"{CONFIG_FILE} is not a JSON object")
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise _fail(path, f"peft_type {peft_type} is not LoRA")
    refused = {
        "use_dora": "DoRA adapters are not supported",
        "modules_to_save": "modules_to_save (fully trained modules) are not supported",
        "fan_in_fan_out": "fan_in_fan_out (Conv1D-layout) adapters are not supported",
    }
    for key, reason in refused.items():
        if config.get(key):
            raise _fail(path, reason)
    if config.get("bias", "none") != "none":
        raise _fail(path, f"bias={config['bias']!r}: adapters with trained biases are not supported")
    return config


def _weights_file(path: Path) -> Path:
    weights = path / WEIGHTS_FILE
    if weights.is_file():
        return weights
    if any((path / name).exists() for name in _PICKLED):
        raise _fail(path, "holds only pickled weights (adapter_model.bin); Octavo loads safetensors only")
    raise _fail(path, f"no {WEIGHTS_FILE}")


def _pairs(path: Path, keys) -> dict[str, dict[str, str]]:
    """module -> {"A": key, "B": key}; anything else in the file is refused."""
    pairs: dict[str, dict[str, str]] = {}
    for key in keys:
        match = _KEY.match(key)
        if match is None:
            raise _fail(path, f"tensor {key!r} is not a LoRA A/B weight (embedding and LM-head adapters are not supported)")
        pairs.setdefault(match["module"], {})[match["kind"]] = key
    for module, pair in pairs.items():
        if len(pair) != 2:
            raise _fail(path, f"module {module} has lora_{next(iter(pair))} but not its pair")
    if not pairs:
        raise _fail(path, f"{WEIGHTS_FILE} holds no LoRA weights")
    return pairs


def _pattern_value(patterns: dict, module: str, default):
    """PEFT's per-module override: a key matching the end of the module's name."""
    for key, value in (patterns or {}).items():
        if module == key or re.fullmatch(rf"(.*\.)?{key}", module):
            return value
    return default


def check_adapter(path: str | Path, targets: Targets, max_lora_rank: int) -> AdapterInfo:
    """Validate the adapter at ``path`` for a model with these LoRA ``targets``."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_dir():
        raise _fail(path, "is not a directory")
    read_config(path)
    weights = _weights_file(path)
    try:
        with safe_open(str(weights), framework="pt") as f:
            shapes = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
    except Exception as exc:  # SafetensorError, OSError
        raise _fail(path, f"could not read {WEIGHTS_FILE}: {exc}") from None
    largest = 0
    pairs = _pairs(path, shapes)
    for module, pair in sorted(pairs.items()):
        if module not in targets:
            raise _fail(path, f"module {module} has no LoRA in this model (LoRA covers its attention and dense MLP projections)")
        in_features, out_features = targets[module]
        shape_a, shape_b = shapes[pair["A"]], shapes[pair["B"]]
        rank = shape_a[0] if len(shape_a) == 2 else -1
        if shape_a != (rank, in_features) or shape_b != (out_features, rank):
            raise _fail(
                path, f"module {module}: lora_A {shape_a} and lora_B {shape_b} do not fit a [{out_features} x {in_features}] projection"
            )
        if rank > max_lora_rank:
            raise _fail(path, f"module {module} has rank {rank}, above max_lora_rank={max_lora_rank}")
        largest = max(largest, rank)
    return AdapterInfo(tuple(sorted(pairs)), largest)


def load_adapter(path: str | Path, dtype: torch.dtype) -> list[AdapterModule]:
    """Every module's ``A`` and scaled ``B`` in ``dtype`` (after ``check_adapter``)."""
    from safetensors.torch import load_file

    path = Path(path)
    config = read_config(path)
    tensors = load_file(str(_weights_file(path)))
    default_alpha = float(config.get("lora_alpha", config.get("r", 8)))
    modules = []
    for module, pair in sorted(_pairs(path, tensors).items()):
        lora_a, lora_b = tensors[pair["A"]], tensors[pair["B"]]
        rank = lora_a.shape[0]
        alpha = float(_pattern_value(config.get("alpha_pattern"), module, default_alpha))
        scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
        # Scaled in float32, then rounded once to the model's dtype.
        scaled_b = (lora_b.to(torch.float32) * scaling).to(dtype)
        modules.append(AdapterModule(module, lora_a.to(dtype), scaled_b))
    return modules
