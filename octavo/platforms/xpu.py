"""Intel GPUs through ``torch.xpu`` (extra ``[xpu]``).

Detection: torch's own XPU support (``torch.xpu.is_available()``, which
counts SYCL devices without creating a context); no vendor package is needed
for that. intel-extension-for-pytorch, when installed, is imported when the
platform is first used (it registers extra XPU kernels); Octavo calls none of
its functions directly yet. Distributed backend: ``xccl`` (oneCCL).
"""

from __future__ import annotations

import torch

from octavo.platforms.probe import package_version
from octavo.platforms.torch_device import TorchDevicePlatform


def _torch_xpu():
    return getattr(torch, "xpu", None)


class XpuPlatform(TorchDevicePlatform):
    name = "xpu"
    device_type = "xpu"
    dist_backend = "xccl"
    priority = 70
    supported_dtypes = (torch.float32, torch.bfloat16, torch.float16)
    supported_quantization = None  # plain-torch paths only, which run on XPU
    supports_graphs = False
    attention_backends = ("torch_paged",)
    optional_vendor_modules = ("intel_extension_for_pytorch",)

    @classmethod
    def is_available(cls) -> bool:
        xpu = _torch_xpu()
        return xpu is not None and bool(xpu.is_available())

    @classmethod
    def availability_detail(cls) -> str:
        xpu = _torch_xpu()
        if xpu is None:
            return f"torch {torch.__version__} has no torch.xpu"
        count = xpu.device_count()
        if count == 0:
            return f"no XPU device visible (torch {torch.__version__})"
        return f"{count} device(s), intel-extension-for-pytorch {package_version('intel-extension-for-pytorch')}"

    def versions(self) -> dict[str, str]:
        return {
            "torch": torch.__version__,
            "intel-extension-for-pytorch": package_version("intel-extension-for-pytorch"),
        }
