"""The in-tree platforms, as the built-in plugin registers them."""

from __future__ import annotations


def builtin_platforms() -> list[type]:
    from octavo.platforms.cpu import CpuPlatform

    return [CpuPlatform]
