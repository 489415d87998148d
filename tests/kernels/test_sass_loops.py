"""The decode GEMVs' inner loops, read from their sm_90 SASS (no GPU needed):
no barrier, so no layout change through shared memory per K step. Such a
conversion (a load whose layout differs from the product's) once cost the
bf16 GEMV two barriers per weight tile and the int4 GEMV sixteen a step;
it compiles and passes every interpreter test, and is only seen here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton.backends.nvidia")

REPO = Path(__file__).resolve().parents[2]
# aot_compile case-name substrings: the 1-token bf16 GEMV with a deferred
# reduction, and the int4 deferred GEMV with one and two row groups.
BARRIER_FREE = ["gemv M1 gated=None", "int4 gemv GroupedGemvConfig(block_n=4, blocks=8, num_warps=4, deferred=True"]


@pytest.mark.slow
def test_decode_gemv_loops_have_no_barriers(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path), PYTHONPATH=str(REPO), TRITON_DEFAULT_FP_FUSION="1")
    report = subprocess.run([sys.executable, "-m", "tests.kernels.sass_loops", *BARRIER_FREE], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=600)
    assert report.returncode == 0, report.stderr[-2000:]
    lines = report.stdout.splitlines()
    kernels = [line for line in lines if not line.startswith(" ")]
    loops = [line for line in lines if line.strip().startswith("loop")]
    assert len(kernels) == 3 and len(loops) >= 3, report.stdout
    assert all(" 0 BAR," in line and " 0 STS," in line for line in loops), report.stdout
