"""Hardware platforms: the ``Platform`` interface and the in-tree plugins."""

from octavo.platforms.interface import MemoryInfo, Platform

__all__ = ["MemoryInfo", "Platform"]
