"""The in-tree quantization methods, as the built-in plugin registers them."""

from __future__ import annotations


def builtin_quantization_methods() -> dict[str, type]:
    return {}
