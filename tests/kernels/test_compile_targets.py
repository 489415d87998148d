"""The kernels compile for the GPUs they target, checked on any machine: the
interpreter-based tests never run Triton's compiler. Every kernel for NVIDIA
sm_90 (H100/H200); the attention kernels, the intricate ones, also for AMD
gfx942 (MI300). Runs ``tests/kernels/aot_compile.py`` in two concurrent
subprocesses without ``TRITON_INTERPRET`` (~20 s on 2 cores: marked slow)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

REPO = Path(__file__).resolve().parents[2]
# (target, triton backend, extra args, kernels compiled, shared-memory limit in bytes)
TARGETS = [
    ("cuda", "nvidia", [], 66, 227 * 1024),
    ("hip", "amd", ["--attention-only"], 12, 64 * 1024),
]


@pytest.mark.slow
def test_kernels_compile_for_gpu_targets(tmp_path):
    runs = []
    for target, backend, extra, expected, limit in TARGETS:
        if importlib.util.find_spec(f"triton.backends.{backend}") is None:
            continue
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env.update(TRITON_CACHE_DIR=str(tmp_path / target), PYTHONPATH=str(REPO), TRITON_DEFAULT_FP_FUSION="1")
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.kernels.aot_compile", target, *extra],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        runs.append((target, expected, limit, process))
    if not runs:
        pytest.skip("this triton build has neither the nvidia nor the amd backend")
    for target, expected, limit, process in runs:
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr[-3000:]
        compiled = [line for line in stdout.splitlines() if line.startswith(target)]
        assert len(compiled) == expected, stdout
        assert all(int(line.split("shared ")[1].split()[0]) <= limit for line in compiled), stdout
