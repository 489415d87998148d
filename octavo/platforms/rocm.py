"""AMD GPUs through a ROCm (HIP) build of torch.

A HIP build of torch drives AMD GPUs through the ``torch.cuda`` namespace and
the ``cuda`` device type, and calls RCCL "nccl"; so this platform shares
everything with ``cuda`` (kernels included: Triton compiles for both) except
its detection, its name and its versions. Detection: ``torch.version.hip``
is set and ``torch.cuda.device_count() > 0`` (torch asks amdsmi first, which
initialises no HIP runtime).
"""

from __future__ import annotations

import os

import torch

from octavo.platforms.cuda import CudaPlatform


class RocmPlatform(CudaPlatform):
    name = "rocm"
    device_type = "cuda"  # torch's device type on HIP builds
    dist_backend = "nccl"  # RCCL, under torch's name for it
    priority = 95

    @classmethod
    def _torch_build_ok(cls) -> bool:
        return getattr(torch.version, "hip", None) is not None

    @classmethod
    def availability_detail(cls) -> str:
        if not cls._torch_build_ok():
            return f"torch {torch.__version__} is not a ROCm build"
        count = torch.cuda.device_count()
        visible = os.environ.get("HIP_VISIBLE_DEVICES") or os.environ.get("ROCR_VISIBLE_DEVICES")
        where = f" (visible: {visible})" if visible is not None else ""
        if count == 0:
            return f"no ROCm device visible{where}"
        return f"{count} device(s){where}, HIP {torch.version.hip}"

    def versions(self) -> dict[str, str]:
        versions = super().versions()
        versions.pop("cuda", None)
        versions["hip"] = str(torch.version.hip)
        return versions
