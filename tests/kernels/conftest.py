"""Kernel tests run on a CUDA device when there is one, else on the CPU
through Triton's interpreter. ``TRITON_INTERPRET`` is read when a kernel is
decorated, so it is set here, before any test module imports triton or an
``octavo.kernels`` kernel module."""

from __future__ import annotations

import os
import sys

import pytest
import torch

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    _early = sorted(m for m in sys.modules if m.startswith("octavo.kernels."))
    if _early:
        raise RuntimeError(f"{_early} were imported before tests/kernels/conftest.py set TRITON_INTERPRET=1")
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture
def device() -> torch.device:
    from tests.kernels.tolerances import DEVICE

    return DEVICE
