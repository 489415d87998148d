"""The kernels compile for the GPUs they target (NVIDIA sm_90, AMD gfx942),
checked on any machine: the interpreter-based tests never run Triton's
compiler. Runs ``tests/kernels/aot_compile.py`` in a subprocess without
``TRITON_INTERPRET``."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

REPO = Path(__file__).resolve().parents[2]


def backend_available(name: str) -> bool:
    return importlib.util.find_spec(f"triton.backends.{name}") is not None


@pytest.mark.parametrize("target,backend", [("cuda", "nvidia"), ("hip", "amd")])
def test_kernels_compile_for_gpu_targets(target, backend, tmp_path):
    if not backend_available(backend):
        pytest.skip(f"this triton build has no {backend} backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path), PYTHONPATH=str(REPO), TRITON_DEFAULT_FP_FUSION="1")
    result = subprocess.run(
        [sys.executable, "-m", "tests.kernels.aot_compile", target],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    compiled = [line for line in result.stdout.splitlines() if line.startswith(target)]
    assert len(compiled) == 10, result.stdout
    # Every kernel fits an H200's / MI300's shared memory (227 KiB / 64 KiB LDS).
    limit = 227 * 1024 if target == "cuda" else 64 * 1024
    assert all(int(line.split("shared ")[1].split()[0]) <= limit for line in compiled), result.stdout
