"""Huawei Ascend NPUs through ``torch_npu`` (extra ``[npu]``).

Detection: ``torch_npu`` is installed and a ``/dev/davinci<N>`` device file
exists; neither imports ``torch_npu``. It is imported when the platform is
first used, which registers the ``npu`` device type and ``torch.npu`` (a
mirror of ``torch.cuda``'s functions). Distributed backend: ``hccl``.
"""

from __future__ import annotations

import torch

from octavo.platforms import probe
from octavo.platforms.torch_device import TorchDevicePlatform

DEVICE_PATTERNS = ("davinci[0-9]*",)


class NpuPlatform(TorchDevicePlatform):
    name = "npu"
    device_type = "npu"
    dist_backend = "hccl"
    priority = 85
    supported_dtypes = (torch.float32, torch.bfloat16, torch.float16)
    supported_quantization = ()  # none verified on Ascend yet
    supports_graphs = False
    attention_backends = ("torch_paged",)
    vendor_modules = ("torch_npu",)

    @classmethod
    def is_available(cls) -> bool:
        return probe.module_installed("torch_npu") and bool(probe.device_files(*DEVICE_PATTERNS))

    @classmethod
    def availability_detail(cls) -> str:
        if not probe.module_installed("torch_npu"):
            return "torch_npu is not installed"
        devices = probe.device_files(*DEVICE_PATTERNS)
        if not devices:
            return f"no Ascend device file under {probe.DEVICE_ROOT} (davinci<N>)"
        return f"{len(devices)} Ascend device file(s)"

    def versions(self) -> dict[str, str]:
        return {"torch": torch.__version__, "torch-npu": probe.package_version("torch-npu")}
