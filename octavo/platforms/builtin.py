"""The in-tree platforms, as the built-in plugin registers them.

Importing a platform module imports torch but no vendor package, so listing
them all is cheap; each one's ``is_available`` decides whether it runs.
"""

from __future__ import annotations


def builtin_platforms() -> list[type]:
    from octavo.platforms.cpu import CpuPlatform
    from octavo.platforms.cuda import CudaPlatform
    from octavo.platforms.hpu import HpuPlatform
    from octavo.platforms.npu import NpuPlatform
    from octavo.platforms.rocm import RocmPlatform
    from octavo.platforms.tpu import TpuPlatform
    from octavo.platforms.xpu import XpuPlatform

    return [CpuPlatform, CudaPlatform, RocmPlatform, XpuPlatform, TpuPlatform, HpuPlatform, NpuPlatform]


def platform_attention_backends() -> dict[str, type]:
    """Attention backends that exist for a platform's sake (TPU's static shapes)."""
    from octavo.runtime.attention.static_paged import StaticPagedAttention

    return {StaticPagedAttention.name: StaticPagedAttention}
