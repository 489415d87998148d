"""Stand-ins for vendor packages and device files, for detection tests.

``VendorEnvironment`` can put on ``sys.path`` a package that *raises when
imported* (so a probe that finds it proved it did not import it), create
device files under a temporary ``/dev`` (``probe.DEVICE_ROOT``), and install
importable stand-in modules in ``sys.modules`` with a fake ``torch.<device>``
namespace, for the code paths that do import the vendor package.
"""

from __future__ import annotations

import importlib
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from octavo.platforms import probe


@dataclass
class FakeDeviceNamespace:
    """What Octavo uses of ``torch.cuda`` / ``torch.xpu`` / ``torch.npu`` / ``torch.hpu``."""

    num_devices: int = 2
    free_bytes: int = 60 << 30
    total_bytes: int = 80 << 30
    calls: list[str] = field(default_factory=list)

    def device_count(self) -> int:
        return self.num_devices

    def set_device(self, index: int) -> None:
        self.calls.append(f"set_device({index})")

    def synchronize(self) -> None:
        self.calls.append("synchronize")

    def mem_get_info(self, index: int | None = None) -> tuple[int, int]:
        return self.free_bytes, self.total_bytes


class VendorEnvironment:
    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root, self.monkeypatch = root, monkeypatch
        self.packages = root / "site"
        self.dev = root / "dev"
        self.packages.mkdir(parents=True)
        self.dev.mkdir()
        monkeypatch.syspath_prepend(str(self.packages))
        monkeypatch.setattr(probe, "DEVICE_ROOT", str(self.dev))
        for variable in ("PJRT_DEVICE", "TPU_ACCELERATOR_TYPE", "TPU_NAME", "TPU_WORKER_ID"):
            monkeypatch.delenv(variable, raising=False)

    def unimportable_package(self, name: str) -> None:
        """A package ``name`` that is installed but raises if anything imports it."""
        package = self.packages / name
        package.mkdir()
        (package / "__init__.py").write_text(f"raise ImportError('{name} must not be imported by a probe')\n")
        importlib.invalidate_caches()

    def device_file(self, relative: str) -> None:
        path = self.dev / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()

    def module(self, name: str, **attributes) -> types.ModuleType:
        """An importable stand-in module (and its parents) in ``sys.modules``."""
        parts = name.split(".")
        for index in range(1, len(parts) + 1):
            partial = ".".join(parts[:index])
            if partial not in sys.modules or index == len(parts):
                self.monkeypatch.setitem(sys.modules, partial, types.ModuleType(partial))
        module = sys.modules[name]
        for key, value in attributes.items():
            setattr(module, key, value)
        return module

    def torch_namespace(self, device_type: str, namespace: FakeDeviceNamespace) -> None:
        self.monkeypatch.setattr(torch, device_type, namespace, raising=False)


@pytest.fixture
def vendor_env(tmp_path, monkeypatch) -> VendorEnvironment:
    return VendorEnvironment(tmp_path, monkeypatch)
