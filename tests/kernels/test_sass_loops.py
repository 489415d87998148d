"""The decode GEMVs' inner loops, read from their sm_90 SASS (no GPU needed):
no barrier, so no layout change through shared memory per K step. Such a
conversion (a load whose layout differs from the product's) once cost the
bf16 GEMV two barriers per weight tile, the int4 GEMV sixteen a step and
the block-scaled fp8 one forty-eight; it compiles and passes every
interpreter test, and is only seen here. One exception is measured, not
assumed: the int4 GEMV's shared-activation form (``int4 common-x gemv``, the
default for two tokens and the one-token default until round 33) keeps its
sixteen barriers a step, as loading each activation once for the program's
rows ran 1.55x faster on an H100 than the barrier-free per-row form (134
against 207 us an 8B layer). The one-token int4 GEMV of round 33 (``quant
int4 gemv rows``, 104 us there, and its bfloat16-pair form) is barrier-free
at its compile case's (8, 8, 8) tiles; at today's default (8, 16, 8) it is
not (``int4_gemv_rows.TILES``), and ``SASS_OVERRIDE`` shows it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton.backends.nvidia")

REPO = Path(__file__).resolve().parents[2]
# Case-name substrings (aot_compile's, and sass_loops' "quant" ones): the
# 1-token bf16 GEMV with a deferred reduction, the gated one at 4 rows, the 8-bit one, the int4 GEMV
# (per block and per plane scales, one and two row groups; the one-token rows form), the MoE decode
# down kernel, the block-scaled fp8 and the GGUF Q4_K 1-token GEMVs. (The pipelined compile cases,
# named apart, have the two barriers a step of Triton's cp.async pipelining.)
BARRIER_FREE = ["gemv M1 gated=None", "gemv M4 gated=silu", "gemv 8-bit", "int4 gemv", "moe decode down top-8",
                "quant fp8 block gemv", "quant gguf gemv 1-token Q4_K", "quant gguf q4k pairs",
                "quant gguf q6k pairs", "quant fp8 gemv rows", "quant gguf q4k dp4a"]
# 1 + 1 + 1 + 10 (four configs, one with programmatic dependent launch, the quant compile case and the
# rows form's three: bfloat16 pairs, prefetching and float32; the dp4a form) + 1 + 1 + 1 + 1
# (Q4_K in pairs) + 1 (Q6_K in pairs) + 1 (fp8 rows) + 1 (Q4_K on dp4a)
EXPECTED_KERNELS = 20


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
    assert len(kernels) == EXPECTED_KERNELS and len(loops) >= EXPECTED_KERNELS, report.stdout
    assert all(" 0 BAR," in line and " 0 STS," in line for line in loops), report.stdout


def test_overrides_split_constexprs_from_compile_options(monkeypatch):
    from tests.kernels.sass_loops import overrides_from_env

    monkeypatch.setenv("SASS_OVERRIDE", "BLOCK_N=8, SPLIT=16, num_warps=8,num_stages=2")
    assert overrides_from_env() == ({"BLOCK_N": 8, "SPLIT": 16}, {"num_warps": 8, "num_stages": 2})
    monkeypatch.delenv("SASS_OVERRIDE")
    assert overrides_from_env() == ({}, {})
