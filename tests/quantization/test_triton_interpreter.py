"""The Triton kernels, run on the CPU through Triton's interpreter.

Triton decides when it is imported whether kernels are interpreted, so these
tests need ``TRITON_INTERPRET=1`` from the start of the process: in a normal
test run, ``test_kernels_under_interpreter`` re-runs this file in a
subprocess with the variable set (and the in-process copies skip, saying
so). Shapes are small: the interpreter runs each program in Python. Known
interpreter limits (Triton 3.9), which compiled kernels do not have:
bfloat16 ``tl.dot`` is wrong (the kernels multiply in float32 under the
interpreter) and float32 -> bfloat16 casts truncate instead of rounding, so
bfloat16 results get a looser tolerance.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed")

from octavo.kernels.quant import int4  # noqa: E402
from octavo.kernels.quant.gguf_dequant import GGML_TYPES_BY_NAME, dequantize_gguf  # noqa: E402
from tests.quantization.test_kernels import QUANT_TYPES, random_blocks  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
needs_interpreter = pytest.mark.skipif(
    not INTERPRETED, reason="runs in a TRITON_INTERPRET=1 subprocess (test_kernels_under_interpreter)"
)


@pytest.mark.skipif(INTERPRETED, reason="already under the interpreter")
def test_kernels_under_interpreter():
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(Path(__file__).relative_to(root))],
        cwd=root, env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and " failed" not in result.stdout


@pytest.fixture(scope="module")
def kernels():
    from octavo.kernels.quant import gguf_triton, int4_triton

    return int4_triton, gguf_triton


TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 2e-2}


@pytest.mark.parametrize(
    "num_tokens,out_features,in_features,group_size,dtype",
    [
        (1, 96, 256, 32, torch.float32),  # split-K decode path, masked N tile
        (5, 64, 128, 64, torch.bfloat16),
        (20, 128, 256, 128, torch.float16),
        (70, 136, 128, 128, torch.float32),  # several M tiles, N not a tile multiple
    ],
)
@needs_interpreter
def test_int4_matmul_matches_reference(kernels, num_tokens, out_features, in_features, group_size, dtype):
    int4_triton, _ = kernels
    torch.manual_seed(0)
    weight = torch.randn(out_features, in_features).to(dtype)
    qweight, scales, zeros = int4.quantize_int4_rtn(weight, group_size)
    x = torch.randn(num_tokens, in_features).to(dtype)
    out = int4_triton.int4_matmul(x, qweight, scales, zeros, group_size)
    dense = int4.dequantize_int4(qweight, scales, zeros, group_size, dtype).float()
    expected = x.float() @ dense.t()
    assert out.dtype == dtype and out.shape == (num_tokens, out_features)
    scale = expected.abs().max()
    assert (out.float() - expected).abs().max() <= TOLERANCE[dtype] * scale


@needs_interpreter
def test_int4_config_splits_k_for_decode(kernels):
    int4_triton, _ = kernels
    assert int4_triton._config(1, 4096, 4096, 128)[3] > 1
    assert int4_triton._config(256, 4096, 4096, 128)[3] == 1  # large batches: no split


@needs_interpreter
@pytest.mark.parametrize("type_name", QUANT_TYPES)
def test_gguf_triton_dequant_bit_exact(kernels, type_name):
    _, gguf_triton = kernels
    t = GGML_TYPES_BY_NAME[type_name]
    raw = torch.from_numpy(random_blocks(type_name, 40 * 512 // t.block_elems, np.random.default_rng(5)).reshape(40, -1))
    expected = dequantize_gguf(raw, t)
    assert torch.equal(gguf_triton.gguf_dequantize(raw, t, torch.float32), expected)


@needs_interpreter
@pytest.mark.parametrize("type_name", QUANT_TYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gguf_triton_matmul(kernels, type_name, dtype):
    _, gguf_triton = kernels
    t = GGML_TYPES_BY_NAME[type_name]
    raw = torch.from_numpy(random_blocks(type_name, 40 * 512 // t.block_elems, np.random.default_rng(6)).reshape(40, -1))
    x = torch.randn(3, 512).to(dtype)
    out = gguf_triton.gguf_matmul(x, raw, t)
    expected = x.float() @ dequantize_gguf(raw, t).t()
    assert out.dtype == dtype
    assert (out.float() - expected).abs().max() <= TOLERANCE[dtype] * expected.abs().max()
