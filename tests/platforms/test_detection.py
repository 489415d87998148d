"""Detection and configuration of every built-in platform, with the vendor
packages absent and present (stand-ins), on a machine without accelerators.

"Present" comes in two forms: a package on ``sys.path`` that raises when
imported (detection must find it without importing it), and importable
stand-in modules plus a fake ``torch.<device>`` namespace (configuration and
the instance methods that do use the vendor package).
"""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

from octavo.errors import InvalidArgumentError
from octavo.platforms.cpu import CpuPlatform
from octavo.platforms.cuda import CudaPlatform
from octavo.platforms.hpu import HpuPlatform
from octavo.platforms.npu import NpuPlatform
from octavo.platforms.rocm import RocmPlatform
from octavo.platforms.tpu import TpuPlatform, parse_memory_info
from octavo.platforms.xpu import XpuPlatform
from octavo.plugins.selection import select_platform
from tests.platforms.stand_ins import FakeDeviceNamespace

VENDOR_MODULES = ("torch_xla", "torch_npu", "habana_frameworks", "intel_extension_for_pytorch")


def test_declarations():
    table = {
        cls.name: (cls.device_type, cls.dist_backend, cls.priority, cls.supports_graphs)
        for cls in (CudaPlatform, RocmPlatform, XpuPlatform, TpuPlatform, HpuPlatform, NpuPlatform, CpuPlatform)
    }
    assert table == {
        "cuda": ("cuda", "nccl", 100, True),
        "rocm": ("cuda", "nccl", 95, True),
        "hpu": ("hpu", "hccl", 90, False),
        "npu": ("npu", "hccl", 85, False),
        "tpu": ("xla", "xla", 80, False),
        "xpu": ("xpu", "xccl", 70, False),
        "cpu": ("cpu", "gloo", 0, False),
    }
    assert TpuPlatform.attention_backends == ("static_paged",)
    assert torch.float16 not in TpuPlatform.supported_dtypes


def test_nothing_but_cpu_here(vendor_env, fresh_plugins):
    selection = select_platform()
    assert selection.platform.name == "cpu"
    details = {c.name: c.detail for c in selection.candidates}
    assert details["tpu"] == "torch_xla is not installed"
    assert details["hpu"] == "habana_frameworks is not installed"
    assert details["npu"] == "torch_npu is not installed"
    assert not any(name in sys.modules for name in VENDOR_MODULES)


def test_cuda_probe_uses_the_device_count_and_never_initialises_cuda(monkeypatch):
    def forbidden():
        raise AssertionError("torch.cuda.is_available() runs cuInit; the probe must not call it")

    monkeypatch.setattr(torch.cuda, "is_available", forbidden)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.version, "cuda", None)
    assert not CudaPlatform.is_available()
    assert CudaPlatform.availability_detail() == f"torch {torch.__version__} is not a CUDA build"
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert CudaPlatform.is_available()
    assert CudaPlatform.availability_detail() == "2 device(s), CUDA 12.8"
    assert not RocmPlatform.is_available()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert not CudaPlatform.is_available()
    assert CudaPlatform.availability_detail() == "no CUDA device visible (CUDA_VISIBLE_DEVICES=)"


def test_cuda_selected_and_configured(monkeypatch, fresh_plugins):
    fake = FakeDeviceNamespace(num_devices=2)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch, "cuda", fake)
    selection = select_platform()
    platform = selection.platform
    assert platform.name == "cuda" and selection.reason.startswith("highest priority (100)")
    assert platform.device_count() == 2
    platform.set_device(1)
    platform.synchronize()
    assert fake.calls == ["set_device(1)", "synchronize"]
    assert platform.memory_info(0).free_bytes == 60 << 30
    assert platform.device(1) == torch.device("cuda", 1)
    assert platform.kv_cache_dtype("fp8") == torch.float8_e4m3fn
    assert platform.kv_cache_dtype("fp8_e5m2") == torch.float8_e5m2
    with pytest.raises(InvalidArgumentError, match="kv_cache_dtype 'int4' is not supported on cuda"):
        platform.kv_cache_dtype("int4")
    assert platform.supported_quantization is None


def test_rocm_detected_from_a_hip_build(monkeypatch, fresh_plugins):
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", "6.3.1", raising=False)
    monkeypatch.setattr(torch, "cuda", FakeDeviceNamespace(num_devices=8))
    monkeypatch.delenv("HIP_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("ROCR_VISIBLE_DEVICES", raising=False)
    assert not CudaPlatform.is_available()
    assert RocmPlatform.availability_detail() == "8 device(s), HIP 6.3.1"
    platform = select_platform().platform
    assert platform.name == "rocm" and platform.device(0) == torch.device("cuda", 0)
    assert platform.dist_backend == "nccl"


def test_xpu_with_and_without_ipex(vendor_env, fresh_plugins):
    assert not XpuPlatform.is_available()
    fake = FakeDeviceNamespace(num_devices=1)
    fake.is_available = lambda: True
    vendor_env.torch_namespace("xpu", fake)
    assert XpuPlatform.is_available()
    assert XpuPlatform.availability_detail() == "1 device(s), intel-extension-for-pytorch not installed"
    platform = select_platform().platform
    assert platform.name == "xpu" and platform.dist_backend == "xccl"
    assert platform.torch_namespace() is fake  # without IPEX, torch.xpu alone
    # With IPEX installed, first use imports it (it registers XPU kernels).
    (vendor_env.packages / "intel_extension_for_pytorch.py").write_text("LOADED = True\n")
    importlib.invalidate_caches()
    try:
        fresh = XpuPlatform()
        assert "intel_extension_for_pytorch" not in sys.modules
        assert fresh.memory_info().total_bytes == 80 << 30
        assert sys.modules["intel_extension_for_pytorch"].LOADED
    finally:
        sys.modules.pop("intel_extension_for_pytorch", None)
    # An IPEX built for another torch fails to import: the platform runs without it.
    (vendor_env.packages / "intel_extension_for_pytorch.py").write_text("raise RuntimeError('built for torch 2.8')\n")
    importlib.invalidate_caches()
    try:
        assert XpuPlatform().memory_info().total_bytes == 80 << 30
    finally:
        sys.modules.pop("intel_extension_for_pytorch", None)


def test_tpu_detection_never_imports_torch_xla(vendor_env, monkeypatch):
    assert TpuPlatform.availability_detail() == "torch_xla is not installed"
    vendor_env.unimportable_package("torch_xla")
    assert not TpuPlatform.is_available()
    assert TpuPlatform.availability_detail() == "no TPU environment variable or device file (/dev/accel*, /dev/vfio/*)"
    vendor_env.device_file("accel0")
    assert TpuPlatform.is_available()
    assert TpuPlatform.availability_detail() == f"TPU found: {vendor_env.dev}/accel0"
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    assert not TpuPlatform.is_available()
    assert TpuPlatform.availability_detail().startswith("PJRT_DEVICE=CPU (not TPU; OCTAVO_TPU_ALLOW_CPU_PJRT=1")
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-8")
    assert TpuPlatform.availability_detail().startswith("TPU found: TPU_ACCELERATOR_TYPE, PJRT_DEVICE=TPU")
    assert "torch_xla" not in sys.modules


def test_tpu_on_the_cpu_pjrt_device_only_when_opted_in(vendor_env, monkeypatch):
    """torch_xla's CPU device is never picked on its own: the opt-in makes
    tpu available without a TPU (PJRT_DEVICE=CPU, or unset with none found)."""
    vendor_env.unimportable_package("torch_xla")
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    assert not TpuPlatform.is_available()
    monkeypatch.setenv("OCTAVO_TPU_ALLOW_CPU_PJRT", "1")
    assert TpuPlatform.is_available() and TpuPlatform.uses_cpu_pjrt()
    assert "CPU PJRT device" in TpuPlatform.availability_detail()
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    assert TpuPlatform.is_available() and TpuPlatform.uses_cpu_pjrt()
    monkeypatch.setenv("PJRT_DEVICE", "TPU")  # a real TPU wins over the opt-in
    assert not TpuPlatform.uses_cpu_pjrt()
    assert "torch_xla" not in sys.modules


def test_tpu_configuration_with_a_stand_in_torch_xla(vendor_env, monkeypatch):
    synced = []
    vendor_env.module("torch_xla", device_count=lambda: 4, device=lambda i=0: f"xla:{i}", sync=lambda: synced.append("sync"))
    vendor_env.module(
        "torch_xla.core.xla_model",
        get_memory_info=lambda device: {"bytes_used": 2 << 30, "bytes_limit": 16 << 30, "peak_bytes_used": 3 << 30},
        wait_device_ops=lambda: synced.append("wait"),
    )
    platform = TpuPlatform()
    assert platform.device_count() == 4
    assert platform.device(1) == torch.device("xla", 1)
    platform.synchronize()
    assert synced == ["sync", "wait"]
    memory = platform.memory_info()
    assert (memory.free_bytes, memory.total_bytes) == (14 << 30, 16 << 30)
    # The conformance kit's Hugging Face reference runs on the CPU, not XLA.
    assert platform.reference_device() == torch.device("cpu")
    assert CpuPlatform().reference_device() == torch.device("cpu")
    assert CudaPlatform().reference_device() == torch.device("cuda", 0)


def test_tpu_memory_info_formats():
    assert parse_memory_info({"bytes_used": 5, "bytes_limit": 10}) == (5, 10, 5)
    assert parse_memory_info({"bytes_used": 5, "bytes_limit": 10, "peak_bytes_used": 7}) == (5, 10, 7)
    assert parse_memory_info({"kb_free": 3, "kb_total": 10}) == (7 * 1024, 10 * 1024, 7 * 1024)


def test_hpu_detection_and_configuration(vendor_env, fresh_plugins):
    vendor_env.unimportable_package("habana_frameworks")
    assert not HpuPlatform.is_available()
    assert HpuPlatform.availability_detail() == f"no Gaudi device file under {vendor_env.dev} (accel/accel*, hl*)"
    vendor_env.device_file("accel/accel0")
    vendor_env.device_file("accel/accel1")
    assert HpuPlatform.availability_detail() == "2 Gaudi device file(s)"
    selection = select_platform()
    assert selection.platform.name == "hpu" and "habana_frameworks" not in sys.modules
    # First use imports the bridge, which provides torch.hpu.
    vendor_env.module("habana_frameworks.torch.core")
    vendor_env.torch_namespace("hpu", FakeDeviceNamespace(num_devices=2))
    platform = selection.platform
    assert platform.device_count() == 2
    assert platform.device(0) == torch.device("hpu", 0)
    assert platform.dist_backend == "hccl" and platform.supported_quantization == ()


def test_hpu_older_driver_device_files(vendor_env):
    vendor_env.unimportable_package("habana_frameworks")
    vendor_env.device_file("hl0")
    assert HpuPlatform.is_available()


def test_npu_detection_and_configuration(vendor_env, fresh_plugins):
    vendor_env.unimportable_package("torch_npu")
    assert not NpuPlatform.is_available()
    vendor_env.device_file("davinci0")
    vendor_env.device_file("davinci_manager")
    assert NpuPlatform.availability_detail() == "1 Ascend device file(s)"
    selection = select_platform()
    assert selection.platform.name == "npu" and "torch_npu" not in sys.modules
    vendor_env.module("torch_npu")
    vendor_env.torch_namespace("npu", FakeDeviceNamespace(num_devices=8, free_bytes=1, total_bytes=2))
    platform = selection.platform
    assert platform.device_count() == 8
    assert platform.memory_info().total_bytes == 2


def test_every_vendor_present_picks_by_priority_and_imports_nothing(vendor_env, monkeypatch, fresh_plugins):
    for package in ("torch_xla", "torch_npu", "habana_frameworks"):
        vendor_env.unimportable_package(package)
    for device in ("accel0", "accel/accel0", "davinci0"):
        vendor_env.device_file(device)
    selection = select_platform()
    available = [c.name for c in selection.candidates if c.available]
    assert available == ["hpu", "npu", "tpu", "cpu"]
    assert selection.platform.name == "hpu"
    monkeypatch.setenv("OCTAVO_PLATFORM", "tpu")
    assert select_platform().platform.name == "tpu"
    assert not any(name in sys.modules for name in VENDOR_MODULES)
