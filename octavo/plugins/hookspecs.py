"""The hooks a plugin may implement (plugin API ``octavo.plugins.API_VERSION``).

Every hook takes no arguments and returns a collection, or ``None`` meaning
"nothing from this plugin". Hooks are called:

* once per plugin when the plugin manager loads it, in every process that
  loads plugins (to catch a broken plugin early: a hook that raises or
  returns the wrong type makes the whole plugin broken and skipped);
* again, on every plugin, each time Octavo needs the merged result (see each
  hook), so results must not depend on call order and must be cheap: return
  classes or ``"module:Class"`` strings, and import heavy packages lazily.

Results from all plugins are merged in load order (built-in first, then the
others sorted by entry-point name); on a name clash the later plugin wins, so
a vendor can replace an in-tree entry.

Processes: the *engine process* builds the engine (``LLM``, ``octavo serve``,
``octavo generate``); a *worker process* owns one device (with one device the
worker lives in the engine process). Both load plugins independently.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from octavo.plugins import hookspec

if TYPE_CHECKING:
    from torch import nn

    from octavo.core.attention import AttentionBackend
    from octavo.ops import OpImpl
    from octavo.platforms.interface import Platform
    from octavo.quantization.base import QuantizationConfig


@hookspec
def octavo_platforms() -> "list[type[Platform]] | None":
    """Return the ``Platform`` subclasses this plugin provides (classes, not instances).

    Called in the engine process when it selects a platform, in every worker
    process when it selects the platform the engine chose, and by
    ``octavo env`` / ``octavo plugins``. Each class's cheap ``is_available()``
    then runs; the selected one is instantiated. ``None``: no platform.
    """


@hookspec
def octavo_models() -> "dict[str, type[nn.Module] | str] | None":
    """Return ``{architecture name: model class or "module:Class"}``.

    Called in each worker process when it builds a model, and by ``octavo
    plugins``. Names match ``config.json``'s ``architectures[0]``; a string
    is imported only when a model of that architecture is loaded.
    ``None``: no model.
    """


@hookspec
def octavo_quantization_methods() -> "dict[str, type[QuantizationConfig]] | None":
    """Return ``{method name: QuantizationConfig subclass}``.

    Called in each worker process when it builds a model (and wherever
    ``--quantization`` is validated), and by ``octavo plugins``. Names
    match ``--quantization`` and the checkpoint's
    ``quantization_config.quant_method``. A platform runs a method only if
    its ``supported_quantization`` is None or lists the name. ``None``: no
    method.
    """


@hookspec
def octavo_attention_backends() -> "dict[str, type[AttentionBackend]] | None":
    """Return ``{backend name: AttentionBackend subclass}``.

    Called in each worker process when the platform picks the backend for a
    model (by name, from ``Platform.attention_backends`` or
    ``OCTAVO_ATTENTION_BACKEND``), and by the conformance suite and
    ``octavo plugins``. ``None``: no backend.
    """


@hookspec
def octavo_layer_ops() -> "list[OpImpl] | None":
    """Return the layer-op implementations this plugin offers (plugin API 1.1).

    Each ``octavo.ops.OpImpl`` names an op of ``octavo.ops.OP_SPECS``
    (``rms_norm``, ``linear``, ``fp8_linear``, ...), the implementation's
    name, its function (or ``"module:function"``, imported only on a
    platform it serves), the conditions it serves under (``platforms``,
    ``device_types``, ``dtypes``, ``supports(ctx)``; per call ``max_tokens``
    and ``accepts``) and a ``priority``. Called in each worker process when
    it builds a model (the model builder resolves every op once, for that
    model's dtype and device), and by ``octavo env``, ``octavo plugins`` and
    the conformance kit. An entry that is malformed or names an unknown op
    makes the plugin broken when it loads; one whose function cannot be
    imported, does not take the op's arguments, or whose ``supports`` raises
    makes it broken at resolution, and none of its implementations is used.
    ``None``: no implementation.
    """
