"""Architecture name (``config.json``'s ``architectures[0]``) -> model class.

In-tree models are registered through the built-in plugin's ``octavo_models``
hook, like a third-party plugin's; classes are given as ``"module:Class"``
strings so that nothing is imported until a model of that kind is loaded.

``resolve_model_class`` adds the task: a causal LM asked to embed is built
as its pooling variant (``decoder_pooling.as_embedding_model``).
"""

from __future__ import annotations

import importlib

from torch import nn

from octavo.errors import UnsupportedModelError


class ModelRegistry:
    def __init__(self) -> None:
        self._models: dict[str, type[nn.Module] | str] = {}

    def register(self, architecture: str, model: type[nn.Module] | str) -> None:
        self._models[architecture] = model

    def architectures(self) -> list[str]:
        return sorted(self._models)

    def resolve(self, architecture: str) -> type[nn.Module]:
        model = self._models.get(architecture)
        if model is None:
            raise UnsupportedModelError(
                f"architecture {architecture!r} is not supported; supported: {', '.join(self.architectures())}"
            )
        if isinstance(model, str):
            module_name, _, class_name = model.partition(":")
            model = getattr(importlib.import_module(module_name), class_name)
            self._models[architecture] = model
        return model


def build_registry() -> ModelRegistry:
    """A registry filled from every loaded plugin's ``octavo_models`` hook."""
    from octavo.plugins.manager import get_plugin_manager

    registry = ModelRegistry()
    for models in get_plugin_manager().hook.octavo_models():
        for architecture, model in (models or {}).items():
            registry.register(architecture, model)
    return registry


def resolve_model_class(architecture: str, task: str = "generate") -> type[nn.Module]:
    """The class that builds ``architecture`` for ``task`` (generate, embed, classify)."""
    model_class = build_registry().resolve(architecture)
    if task != "embed" or getattr(model_class, "pooling_task", None) is not None:
        return model_class
    from octavo.models.decoder_pooling import as_embedding_model
    from octavo.models.llama import LlamaForCausalLM

    if not issubclass(model_class, LlamaForCausalLM):
        raise UnsupportedModelError(f"architecture {architecture!r} cannot serve embeddings")
    return as_embedding_model(model_class)
