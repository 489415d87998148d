"""Quantization formats by name, filled from plugins' hooks.

A format is chosen by ``--quantization NAME`` or by the checkpoint's
``quantization_config.quant_method``; the platform must list it in
``supported_quantization`` or loading stops with a clear message. A
checkpoint that is already quantized cannot be quantized again on load.
"""

from __future__ import annotations

from typing import Any

from octavo.errors import QuantizationError
from octavo.quantization.base import QuantizationConfig


def quantization_methods() -> dict[str, type[QuantizationConfig]]:
    from octavo.plugins.manager import get_plugin_manager

    methods: dict[str, type[QuantizationConfig]] = {}
    for result in get_plugin_manager().hook.octavo_quantization_methods():
        methods.update(result or {})
    return methods


def checkpoint_method_name(hf_quant_config: dict[str, Any] | None) -> str | None:
    if not hf_quant_config:
        return None
    name = hf_quant_config.get("quant_method") or hf_quant_config.get("format")
    return str(name).lower() if name else None


def build_quant_config(
    requested: str | None, hf_quant_config: dict[str, Any] | None, platform: Any
) -> QuantizationConfig | None:
    checkpoint_name = checkpoint_method_name(hf_quant_config)
    if requested is not None:
        requested = requested.lower()
    if checkpoint_name is not None and requested not in (None, checkpoint_name):
        # Quantizing on load reads 16/32-bit weights, which a quantized
        # checkpoint does not have.
        raise QuantizationError(
            f"the checkpoint is already quantized with {checkpoint_name!r}; "
            f"--quantization {requested!r} cannot be applied to it (omit --quantization)"
        )
    name = requested or checkpoint_name
    if name is None:
        return None
    methods = quantization_methods()
    if name not in methods:
        known = ", ".join(sorted(methods)) or "none installed"
        raise QuantizationError(f"unknown quantization method {name!r} (available: {known})")
    supported = getattr(platform, "supported_quantization", None)
    if supported is not None and name not in supported:
        raise QuantizationError(
            f"quantization {name!r} is not supported on platform {platform.name!r} "
            f"(supported there: {', '.join(supported) or 'none'})"
        )
    hf_config = hf_quant_config if checkpoint_name == name else None
    return methods[name].from_hf_config(hf_config)
