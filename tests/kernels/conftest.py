"""Kernel tests run on a CUDA device when there is one, else on the CPU
through Triton's interpreter. ``TRITON_INTERPRET`` is read when a kernel is
decorated, so it is set here, before any test module imports triton or an
``octavo.kernels`` Triton module. The formats' torch dequantizers in
``octavo.kernels.quant`` may be imported earlier (``octavo.ops`` builds its
references from them): only modules that bound ``triton`` count."""

from __future__ import annotations

import os
import sys

import pytest
import torch

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    _early = sorted(
        name
        for name, module in list(sys.modules.items())
        if name.startswith("octavo.kernels.") and hasattr(module, "triton")
    )
    if _early:
        raise RuntimeError(f"{_early} were imported before tests/kernels/conftest.py set TRITON_INTERPRET=1")
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture
def device() -> torch.device:
    from tests.kernels.tolerances import DEVICE

    return DEVICE
