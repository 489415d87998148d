"""The ``plugin_models`` and ``two_devices`` checks.

``plugin_models``: every model architecture a plugin other than the
built-in one registers (``octavo_models``) runs on the platform against the
Hugging Face class it reproduces: the class's ``hf_architecture`` attribute
(plugin API 1.1), else a transformers class of the architecture's own name.
A tiny random checkpoint of that class is written with ``architectures``
naming the plugin's architecture, so that Octavo loads the plugin's model
and transformers its own; greedy tokens and logprobs are compared as in the
``model`` check. Architectures with no such class are skipped, saying so.

``two_devices``: with two devices visible, the tiny Llama runs with tensor
parallelism over both (the platform's ``dist_backend``) and must produce
the greedy tokens of one device; otherwise it is skipped, saying why.
"""

from __future__ import annotations

import gc

import torch

from octavo.plugins.manager import BUILTIN_PLUGIN
from octavo.testing.conformance.checks import ConformanceContext, ConformanceFailure, ConformanceSkip
from octavo.testing.conformance.model import (
    build_tiny_checkpoint,
    build_tiny_llama,
    compare,
    compare_with_hf,
    octavo_greedy_rounds,
)


def _hf_class_for(architecture: str, model_class) -> str | None:
    import transformers

    name = getattr(model_class, "hf_architecture", None) or architecture
    return name if hasattr(transformers, name) else None


def check_plugin_models(ctx: ConformanceContext) -> str:
    from octavo.models.registry import build_registry
    from octavo.plugins.manager import get_plugin_manager

    registry = build_registry()
    checked, skipped = [], []
    for plugin, models in get_plugin_manager().hook.octavo_models.with_plugin_names():
        if plugin == BUILTIN_PLUGIN:
            continue
        for architecture in sorted(models or {}):
            hf_class = _hf_class_for(architecture, registry.resolve(architecture))
            if hf_class is None:
                skipped.append(f"{architecture} [{plugin}] (no transformers class to compare with: set hf_architecture)")
                continue
            path = build_tiny_checkpoint(ctx.workdir / f"plugin-{architecture}", hf_class, architecture)
            summaries = [compare_with_hf(ctx.platform, path, dtype) for dtype in ctx.dtypes[:2]]
            gc.collect()
            checked.append(f"{architecture} [{plugin}] vs {hf_class}: {'; '.join(summaries)}")
    if not checked:
        reason = "no plugin registers a model architecture"
        raise ConformanceSkip(reason if not skipped else f"{reason} that can be compared; skipped: {', '.join(skipped)}")
    return " | ".join(checked) + (f"; skipped: {', '.join(skipped)}" if skipped else "")


def check_two_devices(ctx: ConformanceContext) -> str:
    num_devices = ctx.platform.device_count()
    if num_devices < 2:
        raise ConformanceSkip(f"{num_devices} {ctx.platform.name} device visible; this check needs 2")
    path = build_tiny_llama(ctx.workdir / "tiny-llama")
    dtype = ctx.dtypes[0]
    one, _, _, _ = octavo_greedy_rounds(ctx.platform, path, dtype)
    two, _, free, total = octavo_greedy_rounds(ctx.platform, path, dtype, tensor_parallel_size=2)
    gc.collect()
    if free != total:
        raise ConformanceFailure(f"tensor parallel: {total - free} of {total} KV blocks still in use after generation")
    exact = 0
    for round_one, round_two in zip(one, two):
        for a, b in zip(round_two, round_one):
            compare(a, b, 1e-3 if dtype == torch.float32 else 0.1, "tensor parallel over 2 devices vs 1")
            exact += a.token_ids == b.token_ids
    return (
        f"tensor parallel over 2 of {num_devices} devices ({ctx.platform.dist_backend}): "
        f"{exact}/{sum(len(r) for r in one)} prompts token-identical to one device"
    )
