"""New weights for a running model, in place (RL loops: the policy trained
between rollouts), as vLLM's ``collective_rpc("reload_weights")`` and
``load_weights`` do.

The tensors are copied into the parameters the model already has: every
buffer, captured graph, KV cache and the draft model stay as they are (the
graphs replay on the same addresses, now holding the new values). Weights
come from a checkpoint directory of the same architecture and shapes
(``reload_weights``: the model's own directory by default, every rank
reading its slices), or as ``(name, tensor)`` pairs of the checkpoint's
names (``load_weights``, one process only). Quantized models are refused:
their layers were repacked at load, so a checkpoint's tensors no longer
match them. KV cached under the old weights is stale: the engine forgets
its cached prefixes after a reload (``LLM.reload_weights``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from octavo.errors import ModelLoadError
from octavo.models.config import load_arch_config
from octavo.models.loader import process_weights_after_loading
from octavo.runtime.model_loading import safetensors_tensors

# The shapes a checkpoint must share with the model to be loaded into it.
_SHAPE_FIELDS = (
    "architecture", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim",
)


def reload_weights(runner, weights_path: str | None = None) -> int:
    """Copy a checkpoint's tensors into ``runner``'s model; returns how many were read."""
    config = runner.config
    _check_reloadable(runner)
    path = Path(weights_path or config.model_path)
    if config.load_format not in ("auto", "safetensors", "dummy") or path.suffix == ".gguf":
        raise ModelLoadError("weights reload from safetensors checkpoints only (not GGUF)")
    check_same_shapes(load_arch_config(path), runner.loaded.arch, path)
    return _load(runner, safetensors_tensors(config, path))


def check_same_shapes(arch, current, path) -> None:
    """Refuse a checkpoint (``arch``, its config) whose architecture or shapes are not the running model's."""
    for field in _SHAPE_FIELDS:
        if getattr(arch, field) != getattr(current, field):
            raise ModelLoadError(
                f"{path}: {field} is {getattr(arch, field)!r}, the running model's {getattr(current, field)!r}; "
                "weights reload into a model of the same architecture and shapes"
            )


def load_weights(runner, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Copy ``(checkpoint name, tensor)`` pairs into ``runner``'s model (a
    partial set is fine: the rest keep their values); returns how many were read."""
    _check_reloadable(runner)
    return _load(runner, weights, partial=True)


def _check_reloadable(runner) -> None:
    if runner.loaded is None:
        raise ModelLoadError("the model is not loaded yet")
    if runner.loaded.arch.quantization_config is not None or runner.config.quantization is not None:
        raise ModelLoadError(
            "weights cannot be reloaded into a quantized model (its layers were repacked when it loaded)"
        )


def _load(runner, weights: Iterable[tuple[str, torch.Tensor]], partial: bool = False) -> int:
    counted = _Counted(weights)
    model = runner.loaded.model
    with torch.no_grad():
        if partial:
            from octavo.models.weight_loading import load_named_tensors
            from octavo.models.weights import param_name

            load_named_tensors(model, counted, lambda name: param_name(name, getattr(model, "checkpoint_renames", ())))
        else:
            model.load_weights(counted)
        process_weights_after_loading(model)
    return counted.count


class _Counted:
    """The tensors, each a fresh view so that it is copied into its parameter
    (never adopted: a parameter keeps its own memory, which graphs read)."""

    def __init__(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.weights, self.count = weights, 0

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self.weights:
            self.count += 1
            yield name, tensor.view(tensor.shape)
