"""Programmatic dependent launch (``octavo/kernels/pdl.py``): when kernels
take it, and what their sm_90 code does with it (no GPU needed): every PDL
form waits for the kernel before (``ACQBULK``) ahead of its first store and
releases the next one (``PREEXIT``); the ordinary forms do neither. Whether
it keeps every token is a GPU test (``tests/gpu/test_gpu_parity.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels import pdl  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CUDA = torch.device("cuda", 0)


@pytest.fixture
def hopper(monkeypatch):
    """A CUDA device of compute capability 9.0, outside the interpreter."""
    monkeypatch.setattr(pdl, "_device_has_pdl", lambda index: True)
    monkeypatch.setattr(pdl, "interpreting", lambda: False)


def test_pdl_is_on_for_small_launches_unless_turned_off(hopper, monkeypatch):
    monkeypatch.delenv(pdl.PDL_ENV, raising=False)
    assert pdl.pdl_enabled(CUDA, 1) and pdl.pdl_enabled(CUDA, pdl.PDL_MAX_TOKENS)
    assert not pdl.pdl_enabled(CUDA, pdl.PDL_MAX_TOKENS + 1)  # a prefill or a large batch's step
    monkeypatch.setenv(pdl.PDL_ENV, "0")
    assert not pdl.pdl_enabled(CUDA, 1)
    monkeypatch.setenv(pdl.PDL_ENV, "1")
    assert pdl.pdl_enabled(CUDA, 1)
    assert not pdl.pdl_enabled(torch.device("cpu"), 1)


def test_pdl_needs_hopper_and_compiled_kernels(monkeypatch):
    monkeypatch.delenv(pdl.PDL_ENV, raising=False)
    monkeypatch.setattr(pdl, "_device_has_pdl", lambda index: False)  # pre-Hopper, or ROCm
    monkeypatch.setattr(pdl, "interpreting", lambda: False)
    assert not pdl.pdl_enabled(CUDA, 1)
    monkeypatch.setattr(pdl, "_device_has_pdl", lambda index: True)
    monkeypatch.setattr(pdl, "interpreting", lambda: True)  # Triton's interpreter has no grid dependency control
    assert not pdl.pdl_enabled(CUDA, 1)


SASS_CHECK = """
from triton.backends.compiler import GPUTarget
from tests.kernels.aot_compile import case_pointers, cases, compile_one
from tests.kernels.sass_loops import disassemble

target = GPUTarget("cuda", 90, 32)
for name, kernel, consts, tiles in cases():
    if "PDL" not in consts:
        continue
    options = dict(num_warps=tiles.num_warps, num_stages=tiles.num_stages) if tiles else {}
    code = disassemble(compile_one(kernel, consts, target, **options, pointers=case_pointers(name)).asm["cubin"])
    waits = [address for address, opcode, _ in code if opcode.startswith("ACQBULK")]
    releases = [address for address, opcode, _ in code if opcode.startswith("PREEXIT")]
    stores = [address for address, opcode, _ in code if opcode.startswith(("STG", "RED", "ATOMG"))]
    print(name, "|", int(consts["PDL"]), len(waits), len(releases), int(bool(waits) and min(waits) < min(stores)))
"""


@pytest.mark.slow
def test_pdl_forms_wait_before_they_store(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path), PYTHONPATH=str(REPO), TRITON_DEFAULT_FP_FUSION="1")
    report = subprocess.run([sys.executable, "-c", SASS_CHECK], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=900)
    assert report.returncode == 0, report.stderr[-2000:]
    rows = [line.rsplit("|", 1) for line in report.stdout.splitlines() if "|" in line]
    forms = {name.strip(): tuple(int(v) for v in numbers.split()) for name, numbers in rows}
    with_pdl = {name: counts for name, counts in forms.items() if counts[0] == 1}
    assert len(with_pdl) >= 8, report.stdout
    # PDL forms: at least one wait, one release, the first wait ahead of the first store.
    assert all(waits >= 1 and releases == 1 and ordered for _, waits, releases, ordered in with_pdl.values()), forms
    # The ordinary forms: neither.
    assert all(counts[1:3] == (0, 0) for name, counts in forms.items() if counts[0] == 0), forms


def test_env_line_says_whether_pdl_is_on(hopper, monkeypatch):
    monkeypatch.delenv(pdl.PDL_ENV, raising=False)
    assert pdl.pdl_status(CUDA).startswith(f"on for decode launches of up to {pdl.PDL_MAX_TOKENS} tokens")
    monkeypatch.setenv(pdl.PDL_ENV, "0")
    assert pdl.pdl_status(CUDA) == "off (OCTAVO_PDL=0)"
    monkeypatch.delenv(pdl.PDL_ENV)
    monkeypatch.setattr(pdl, "_device_has_pdl", lambda index: False)
    assert pdl.pdl_status(CUDA).startswith("not available here")
