"""The ``example`` platform: the CPU, presented as if it were an accelerator.

Everything a real vendor platform declares is here: a cheap probe, a device
type and distributed backend, dtypes, quantization methods, the attention
backends it prefers (by name; the backend itself is registered by the
plugin's ``octavo_attention_backends`` hook) and a memory query. Its
priority is negative, so it never wins selection on its own: it runs only
when asked for (``OCTAVO_PLATFORM=example``).
"""

from __future__ import annotations

import os

import torch

from octavo.platforms import MemoryInfo, Platform


class ExamplePlatform(Platform):
    name = "example"
    device_type = "cpu"
    dist_backend = "gloo"
    priority = -1
    supported_dtypes = (torch.float32, torch.bfloat16)
    supported_quantization = ("example_int8",)
    supports_graphs = False
    attention_backends = ("example_paged",)

    @classmethod
    def is_available(cls) -> bool:
        # A real probe looks for the vendor's package and device files,
        # without importing the package.
        return True

    @classmethod
    def availability_detail(cls) -> str:
        return "runs on the CPU; chosen only by name (priority -1)"

    def device_count(self) -> int:
        return 1

    def device(self, index: int = 0) -> torch.device:
        return torch.device("cpu")

    def memory_info(self, index: int = 0) -> MemoryInfo:
        page_size = os.sysconf("SC_PAGE_SIZE")
        return MemoryInfo(
            free_bytes=os.sysconf("SC_AVPHYS_PAGES") * page_size,
            total_bytes=os.sysconf("SC_PHYS_PAGES") * page_size,
        )

    def versions(self) -> dict[str, str]:
        from importlib.metadata import PackageNotFoundError, version

        try:
            own = version("octavo-example-accelerator")
        except PackageNotFoundError:
            own = "not installed (imported from a source tree)"
        return {"octavo-example-accelerator": own, "torch": torch.__version__}
