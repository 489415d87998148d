"""Intel Gaudi accelerators through ``habana_frameworks.torch``.

Detection: the ``habana_frameworks`` package is installed and a Gaudi device
file exists (``/dev/accel/accel*`` on current drivers, ``/dev/hl*`` on older
ones); neither imports the package. The PyTorch bridge ships with Intel's
Gaudi software stack, not on PyPI, so there is no ``[hpu]`` extra to pull it.
``habana_frameworks.torch.core`` is imported when the platform is first used:
it registers the ``hpu`` device type and ``torch.hpu``. Distributed backend:
``hccl``.
"""

from __future__ import annotations

import torch

from octavo.platforms import probe
from octavo.platforms.torch_device import TorchDevicePlatform

DEVICE_PATTERNS = ("accel/accel[0-9]*", "hl[0-9]*")


class HpuPlatform(TorchDevicePlatform):
    name = "hpu"
    device_type = "hpu"
    dist_backend = "hccl"
    priority = 90
    supported_dtypes = (torch.bfloat16, torch.float32)
    supported_quantization = ()  # none verified on Gaudi yet
    supports_graphs = False
    attention_backends = ("torch_paged",)
    vendor_modules = ("habana_frameworks.torch.core",)

    @classmethod
    def is_available(cls) -> bool:
        return probe.module_installed("habana_frameworks") and bool(probe.device_files(*DEVICE_PATTERNS))

    @classmethod
    def availability_detail(cls) -> str:
        if not probe.module_installed("habana_frameworks"):
            return "habana_frameworks is not installed"
        devices = probe.device_files(*DEVICE_PATTERNS)
        if not devices:
            return f"no Gaudi device file under {probe.DEVICE_ROOT} (accel/accel*, hl*)"
        return f"{len(devices)} Gaudi device file(s)"

    def versions(self) -> dict[str, str]:
        return {"torch": torch.__version__, "habana-torch-plugin": probe.package_version("habana-torch-plugin")}
