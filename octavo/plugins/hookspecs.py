"""The hooks a plugin may implement. Plugin API version: see ``API_VERSION``.

Every hook is called with no arguments and returns a collection (or ``None``,
meaning "nothing from this plugin"). Results from all plugins are merged; on
a name clash the plugin registered last wins, and built-in entries are
registered first so that a vendor can replace them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from octavo.plugins import hookspec

if TYPE_CHECKING:
    from torch import nn

    from octavo.core.attention import AttentionBackend
    from octavo.platforms.interface import Platform
    from octavo.quantization.base import QuantizationConfig


@hookspec
def octavo_platforms() -> "list[type[Platform]] | None":
    """Return the ``Platform`` classes this plugin provides.

    Called once per process that selects a platform (the engine process and
    every worker process), before any model is loaded. The classes'
    ``is_available()`` probes then decide which platform runs. ``None``: the
    plugin adds no platform.
    """


@hookspec
def octavo_models() -> "dict[str, type[nn.Module] | str] | None":
    """Return ``{architecture name: model class or "module:Class"}``.

    Called in each worker process when it builds a model (and by
    ``octavo env``). Names match ``config.json``'s ``architectures[0]``.
    ``None``: the plugin adds no model.
    """


@hookspec
def octavo_quantization_methods() -> "dict[str, type[QuantizationConfig]] | None":
    """Return ``{method name: QuantizationConfig subclass}``.

    Called in each worker process when it builds a model, and in the engine
    process to validate ``--quantization``. Names match ``--quantization``
    and the checkpoint's ``quantization_config.quant_method``. ``None``: the
    plugin adds no method.
    """


@hookspec
def octavo_attention_backends() -> "dict[str, type[AttentionBackend]] | None":
    """Return ``{backend name: AttentionBackend subclass}``.

    Called in each worker process when a platform looks up a backend by name
    (``OCTAVO_ATTENTION_BACKEND``) and by the conformance suite. ``None``:
    the plugin adds no backend.
    """
