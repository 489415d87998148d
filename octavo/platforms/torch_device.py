"""A base for platforms driven through a ``torch.cuda``-like namespace.

CUDA, ROCm, XPU, Gaudi (HPU) and Ascend (NPU) all expose the same functions
under ``torch.<device_type>`` (``device_count``, ``set_device``,
``synchronize``, ``mem_get_info``, peak-memory statistics), some only once
their vendor package is imported. A subclass names that package in
``vendor_modules``; it is imported on first use by an instance (never by
``is_available``), so probing stays cheap.
"""

from __future__ import annotations

import importlib
import logging
from types import ModuleType
from typing import Any, ClassVar

import torch

from octavo.platforms.interface import MemoryInfo, Platform
from octavo.platforms.probe import module_installed
from octavo.platforms.profiling import profile_kv_cache_budget

logger = logging.getLogger(__name__)


def _import_optional(module: str) -> None:
    # An optional package built for another torch (IPEX pins its torch)
    # fails to import: run without its extra kernels rather than not at all.
    try:
        importlib.import_module(module)
    except Exception as exc:
        logger.warning("optional package %s is installed but does not import (%s: %s); continuing without it",
                       module, type(exc).__name__, exc)


class TorchDevicePlatform(Platform):
    # Imported, in order, before ``torch.<device_type>`` is used.
    vendor_modules: ClassVar[tuple[str, ...]] = ()
    # Imported when installed (extra kernels), skipped otherwise.
    optional_vendor_modules: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        self._namespace: ModuleType | None = None

    def torch_namespace(self) -> Any:
        """``torch.<device_type>``, after importing the vendor package(s)."""
        if self._namespace is None:
            for module in self.vendor_modules:
                importlib.import_module(module)
            for module in self.optional_vendor_modules:
                if module_installed(module.partition(".")[0]):
                    _import_optional(module)
            self._namespace = getattr(torch, self.device_type)
        return self._namespace

    def device_count(self) -> int:
        return int(self.torch_namespace().device_count())

    def set_device(self, index: int) -> None:
        self.torch_namespace().set_device(index)

    def synchronize(self) -> None:
        self.torch_namespace().synchronize()

    def memory_info(self, index: int = 0) -> MemoryInfo:
        free, total = self.torch_namespace().mem_get_info(index)
        return MemoryInfo(free_bytes=int(free), total_bytes=int(total))

    def create_event(self) -> Any:
        return self.torch_namespace().Event()

    def kv_cache_budget(self, runner: Any, memory_utilization: float) -> int | None:
        return profile_kv_cache_budget(runner, memory_utilization, self.torch_namespace())
