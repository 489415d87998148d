"""Kernel tests run on a CUDA device when there is one, else on the CPU
through Triton's interpreter. ``TRITON_INTERPRET`` is read when a kernel is
decorated, so it is set here, before any test module imports triton or an
``octavo.kernels`` kernel module."""

from __future__ import annotations

import os
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
    _early = [m for m in sys.modules if m.startswith("octavo.kernels.") and m != "octavo.kernels.fused_ops"]
    if "triton" in sys.modules and _early:
        raise RuntimeError(f"kernel modules {_early} were imported before TRITON_INTERPRET was set")

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture
def device() -> torch.device:
    return DEVICE
