"""Google TPUs through torch_xla (extra ``[tpu]``).

Detection, without importing torch_xla: the package is installed
(``importlib.util.find_spec``), ``PJRT_DEVICE`` is unset or ``TPU``, and
either a TPU environment variable (``TPU_ACCELERATOR_TYPE``, ``TPU_NAME``,
``TPU_WORKER_ID``, or ``PJRT_DEVICE=TPU``) or a TPU device file
(``/dev/accel<N>``, ``/dev/vfio/<N>``) is present. torch_xla is imported only
when the platform is first used.

XLA compiles one program per distinct set of shapes, so TPU runs the
``static_paged`` attention backend, whose shapes come from a few padded
buckets and which never reads device values on the host.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import torch

from octavo.platforms import probe
from octavo.platforms.interface import MemoryInfo, Platform
from octavo.platforms.profiling import profile_kv_cache_budget

DEVICE_PATTERNS = ("accel[0-9]*", "vfio/[0-9]*")
ENV_HINTS = ("TPU_ACCELERATOR_TYPE", "TPU_NAME", "TPU_WORKER_ID")


def parse_memory_info(info: dict[str, Any]) -> tuple[int, int, int]:
    """``(used, total, peak)`` bytes from ``xm.get_memory_info``, old or new format."""
    if "bytes_limit" in info:
        used, total = int(info["bytes_used"]), int(info["bytes_limit"])
        return used, total, int(info.get("peak_bytes_used", used))
    total = int(info["kb_total"]) * 1024
    used = total - int(info["kb_free"]) * 1024
    return used, total, used


class _XlaMemory:
    """``DeviceMemoryApi`` over XLA's counters: all device memory is the runtime's."""

    def __init__(self, platform: TpuPlatform) -> None:
        self.platform = platform

    def _info(self) -> tuple[int, int, int]:
        return parse_memory_info(self.platform.xla_model().get_memory_info(self.platform.device()))

    def mem_get_info(self) -> tuple[int, int]:
        used, total, _ = self._info()
        return total - used, total

    def memory_reserved(self) -> int:
        return self._info()[0]

    def max_memory_allocated(self) -> int:
        return self._info()[2]

    def reset_peak_memory_stats(self) -> None:
        pass  # XLA keeps the process-wide peak; it only ever overestimates here

    def empty_cache(self) -> None:
        pass

    def synchronize(self) -> None:
        self.platform.synchronize()


class TpuPlatform(Platform):
    name = "tpu"
    device_type = "xla"
    dist_backend = "xla"
    priority = 80
    supported_dtypes = (torch.bfloat16, torch.float32)
    supported_quantization = ()  # none verified on TPU yet
    supports_graphs = False  # XLA compiles whole steps already
    attention_backends = ("static_paged",)

    @classmethod
    def _hints(cls) -> list[str]:
        hints = [name for name in ENV_HINTS if os.environ.get(name)]
        if os.environ.get("PJRT_DEVICE") == "TPU":
            hints.append("PJRT_DEVICE=TPU")
        return hints + probe.device_files(*DEVICE_PATTERNS)

    @classmethod
    def is_available(cls) -> bool:
        if not probe.module_installed("torch_xla"):
            return False
        if os.environ.get("PJRT_DEVICE", "TPU") != "TPU":
            return False
        return bool(cls._hints())

    @classmethod
    def availability_detail(cls) -> str:
        if not probe.module_installed("torch_xla"):
            return "torch_xla is not installed"
        pjrt = os.environ.get("PJRT_DEVICE", "TPU")
        if pjrt != "TPU":
            return f"PJRT_DEVICE={pjrt} (not TPU)"
        hints = cls._hints()
        if not hints:
            return "no TPU environment variable or device file (/dev/accel*, /dev/vfio/*)"
        return "TPU found: " + ", ".join(hints[:4])

    def torch_xla(self) -> Any:
        return importlib.import_module("torch_xla")

    def xla_model(self) -> Any:
        return importlib.import_module("torch_xla.core.xla_model")

    def device_count(self) -> int:
        return int(self.torch_xla().device_count())

    def device(self, index: int = 0) -> torch.device:
        return torch.device(self.torch_xla().device(index))

    def synchronize(self) -> None:
        self.torch_xla().sync()
        self.xla_model().wait_device_ops()

    def memory_info(self, index: int = 0) -> MemoryInfo:
        used, total, _ = parse_memory_info(self.xla_model().get_memory_info(self.device(index)))
        return MemoryInfo(free_bytes=total - used, total_bytes=total)

    def kv_cache_budget(self, runner: Any, memory_utilization: float) -> int | None:
        return profile_kv_cache_budget(runner, memory_utilization, _XlaMemory(self))

    def versions(self) -> dict[str, str]:
        return {"torch": torch.__version__, "torch-xla": probe.package_version("torch-xla")}
