"""The CPU platform: always available, the floor of the selection order.

It runs the plain-torch paged attention backend, which is also the reference
every other backend is tested against.
"""

from __future__ import annotations

import os

import torch

from octavo.platforms.interface import MemoryInfo, Platform


class CpuPlatform(Platform):
    name = "cpu"
    device_type = "cpu"
    dist_backend = "gloo"
    priority = 0
    supported_quantization = ("fp8", "compressed-tensors", "int8", "int8_weight_only", "int4", "gptq", "awq", "gguf")

    @classmethod
    def is_available(cls) -> bool:
        return True

    @classmethod
    def availability_detail(cls) -> str:
        return f"always available ({os.cpu_count()} cores)"

    def device_count(self) -> int:
        return 1

    def device(self, index: int = 0) -> torch.device:
        return torch.device("cpu")

    def memory_info(self, index: int = 0) -> MemoryInfo:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        available = os.sysconf("SC_AVPHYS_PAGES")
        return MemoryInfo(free_bytes=available * page_size, total_bytes=pages * page_size)

    def attention_backend(self, spec):
        from octavo.runtime.attention.torch_paged import TorchPagedAttention

        reason = TorchPagedAttention.supports(spec)
        if reason is not None:
            from octavo.errors import PlatformError

            raise PlatformError(f"the cpu attention backend cannot run this model: {reason}")
        return TorchPagedAttention(spec)

    def kv_cache_budget(self, runner, memory_utilization: float) -> int | None:
        # OCTAVO_CPU_KVCACHE_SPACE (GiB) is the CPU's analogue of
        # gpu_memory_utilization; unset means the runner's default.
        space = os.environ.get("OCTAVO_CPU_KVCACHE_SPACE")
        return int(float(space) * 2**30) if space else None

    def kv_cache_dtype(self, name: str) -> torch.dtype:
        if name in ("fp8", "fp8_e4m3"):
            return torch.float8_e4m3fn
        return super().kv_cache_dtype(name)

    def versions(self) -> dict[str, str]:
        return {"torch": torch.__version__, "threads": str(torch.get_num_threads())}
