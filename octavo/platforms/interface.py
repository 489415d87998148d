"""The ``Platform`` interface: everything hardware-specific, behind one object.

The core never asks "is this CUDA?": it asks the selected platform for an
object (attention backend, graph runner) or a capability (dtypes,
quantization methods). ``is_available`` must be cheap and import nothing
heavy: it runs for every installed platform at startup.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

if TYPE_CHECKING:
    from octavo.core.attention import AttentionBackend, AttentionSpec


@dataclass
class MemoryInfo:
    free_bytes: int
    total_bytes: int


class Platform(ABC):
    name: ClassVar[str]
    device_type: ClassVar[str]  # torch device type: "cpu", "cuda", "xpu", ...
    dist_backend: ClassVar[str]  # torch.distributed backend: gloo, nccl, ...
    # Higher wins when several platforms are available; cpu is the floor.
    priority: ClassVar[int] = 0
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32, torch.bfloat16, torch.float16)
    supported_quantization: ClassVar[tuple[str, ...]] = ()
    # True when decode steps can be captured and replayed as graphs.
    supports_graphs: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def is_available(cls) -> bool:
        """Cheap probe: is this hardware (and its Python package) here?"""

    @classmethod
    def availability_detail(cls) -> str:
        """One line for ``octavo env``: why ``is_available`` said what it said."""
        return "available" if cls.is_available() else "not available"

    @abstractmethod
    def device_count(self) -> int:
        """Number of devices of this kind visible to this process."""

    def device(self, index: int = 0) -> torch.device:
        return torch.device(self.device_type, index)

    def set_device(self, index: int) -> None:
        """Make device ``index`` current for this process (worker startup)."""

    @abstractmethod
    def memory_info(self, index: int = 0) -> MemoryInfo:
        """Free and total memory of device ``index``."""

    def synchronize(self) -> None:
        """Wait for queued work on the current device."""

    @abstractmethod
    def attention_backend(self, spec: "AttentionSpec") -> "AttentionBackend":
        """The attention backend to use for a model with this spec."""

    def graph_runner(self) -> Any | None:
        """A factory for step graphs (CUDA/HIP graphs), or None."""
        return None

    def check_config(self, config: Any) -> None:
        """Raise ``PlatformError`` (or adjust) if ``config`` cannot run here."""
        dtype = getattr(config, "torch_dtype", None)
        if dtype is not None and dtype not in self.supported_dtypes:
            from octavo.errors import PlatformError

            supported = ", ".join(str(d).removeprefix("torch.") for d in self.supported_dtypes)
            raise PlatformError(f"dtype {dtype} is not supported on {self.name} (supported: {supported})")

    def kv_cache_dtype(self, name: str) -> torch.dtype:
        """The torch dtype for a ``kv_cache_dtype`` option other than ``auto``."""
        from octavo.errors import InvalidArgumentError

        raise InvalidArgumentError(f"kv_cache_dtype {name!r} is not supported on {self.name}", param="kv_cache_dtype")

    def kv_cache_budget(self, runner: Any, memory_utilization: float) -> int | None:
        """Bytes for the KV cache after the model is loaded; None: use the default."""
        return None

    def optimize_model(self, model: torch.nn.Module) -> None:
        """Swap in fused kernels after loading; default: keep the torch code."""

    def default_max_num_batched_tokens(self) -> int:
        return 2048

    def versions(self) -> dict[str, str]:
        """Versions of the vendor packages, for ``octavo env``."""
        return {}
