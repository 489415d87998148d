"""The Triton kernels compile for Hopper (sm_90) and Ampere (sm_80) without a
GPU: Triton's NVIDIA backend lowers them to PTX and cubin (with its bundled
ptxas) on any host. This catches what the interpreter cannot (constructs the
compiler rejects) before the kernels reach the GPU machine.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

triton = pytest.importorskip("triton", reason="Triton is not installed")

# tests/kernels/conftest.py turns on Triton's interpreter for the whole
# session on a CPU-only machine; @triton.jit then yields functions that cannot
# be compiled, so the compile checks run in a fresh process instead.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
compiled_here = pytest.mark.skipif(INTERPRETED, reason="the interpreter is on: compiled in a subprocess instead")


@pytest.mark.skipif(not INTERPRETED, reason="compiled in this process")
def test_kernels_compile_in_a_fresh_process():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", __file__],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]

from octavo.kernels.quant import gguf_triton, int4_triton  # noqa: E402

INT4_SIGNATURE = {
    "x_ptr": "*bf16", "qweight_ptr": "*i32", "scales_ptr": "*bf16", "zeros_ptr": "*u8", "out_ptr": "*bf16",
    "M": "i32", "N": "i32", "K": "i32", "group_size": "i32", "stride_xm": "i32", "stride_xk": "i32",
    "stride_qk": "i32", "stride_qn": "i32", "stride_sg": "i32", "stride_zg": "i32", "stride_om": "i32",
    "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "SPLIT_K": "constexpr",
    "DOT_PRECISION": "constexpr", "UPCAST_DOT": "constexpr",
}
GGUF_MATMUL_SIGNATURE = {
    "x_ptr": "*bf16", "w_ptr": "*u8", "out_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32", "row_bytes": "i32",
    "stride_xm": "i32", "stride_om": "i32", "TYPE": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
    "BLOCK_K": "constexpr", "DOT_PRECISION": "constexpr", "UPCAST_DOT": "constexpr",
}
GGUF_DEQUANT_SIGNATURE = {
    "w_ptr": "*u8", "out_ptr": "*bf16", "N": "i32", "K": "i32", "row_bytes": "i32",
    "TYPE": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr",
}


def compile_for(fn, signature: dict, constexprs: dict, capability: int):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    try:
        import triton.backends.nvidia  # noqa: F401
    except ImportError:
        pytest.skip("Triton has no NVIDIA backend here")
    kernel = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs), target=GPUTarget("cuda", capability, 32))
    assert "cubin" in kernel.asm


@compiled_here
@pytest.mark.parametrize("capability", [90, 80])
def test_int4_kernel_compiles(capability):
    for split_k, out in ((1, "*bf16"), (4, "*fp32")):
        constexprs = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "SPLIT_K": split_k, "DOT_PRECISION": "tf32", "UPCAST_DOT": False}
        compile_for(int4_triton._int4_matmul_kernel, dict(INT4_SIGNATURE, out_ptr=out), constexprs, capability)


@compiled_here
@pytest.mark.parametrize("type_name", list(gguf_triton._CODES))
def test_gguf_kernels_compile(type_name):
    code = gguf_triton._CODES[type_name]
    matmul = {"TYPE": code, "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "DOT_PRECISION": "tf32", "UPCAST_DOT": False}
    compile_for(gguf_triton._gguf_matmul_kernel, GGUF_MATMUL_SIGNATURE, matmul, 90)
    compile_for(gguf_triton._gguf_dequant_kernel, GGUF_DEQUANT_SIGNATURE, {"TYPE": code, "BLOCK_N": 16, "BLOCK_K": 256}, 90)
