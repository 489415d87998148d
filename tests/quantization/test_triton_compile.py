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

import triton.language as tl  # noqa: E402

from octavo.kernels import gemv  # noqa: E402
from octavo.kernels.quant import (  # noqa: E402
    fp8_block_triton, fp8_fused, fp8_gemv_rows, fp8_triton, gguf_q4k_dp4a, gguf_q4k_pairs, gguf_q6k_pairs, gguf_triton, int4_gemv_dp4a,
    int4_gemv_rows, int4_mm_triton, int4_triton, int8_activations, skinny_8bit,
)


def signature(kernel, constexprs: dict, pointers: dict) -> dict:
    """Argument types: constexprs, the given pointer types, bf16 for other pointers, i32 for scalars."""
    types = {}
    for name in kernel.arg_names:
        if name in constexprs:
            types[name] = "constexpr"
        else:
            types[name] = pointers.get(name, "*bf16" if name.endswith("_ptr") else "i32")
    return types


INT4 = {"w_ptr": "*i32", "z_ptr": "*u8"}
FP8 = "*fp8e4nv"
MM = dict(BITS=4, GROUP_M=8, DOT_DTYPE=tl.bfloat16, PRECISION=None, SWAP_AB=False, PAIRS=False, ASM=True)
# (kernel, constexprs, pointer types, compile options): Llama-3.1-8B tiles.
QUANT_KERNELS = {
    "int4 gemv": (int4_triton._grouped_gemv_kernel, dict(BITS=4, P=16, BLOCK_M=1, BLOCK_N=4, BLOCKS=4, HAS_BIAS=False,
                  ROW_GROUPS=2, PLANE_SCALES=False, PDL=False), INT4, {}),
    "int4 common-x gemv": (int4_triton._grouped_gemv_shared_kernel, dict(BITS=4, P=16, BLOCK_M=1, BLOCK_N=4, BLOCKS=8,
                         HAS_BIAS=False, PDL=True), INT4, {}),
    "int4 gemv rows": (int4_gemv_rows._int4_gemv_rows_kernel, dict(BLOCK_N=8, SPLIT=8, HAS_BIAS=False, PACKED=True,
                       ASM=True, PDL=True, PREFETCH=False, STAGES=1, blocks_per_group=1), INT4, dict(num_warps=8)),
    "int4 gemv rows prefetch": (int4_gemv_rows._int4_gemv_rows_kernel, dict(BLOCK_N=8, SPLIT=8, HAS_BIAS=False,
                                PACKED=True, ASM=True, PDL=True, PREFETCH=True, STAGES=1, blocks_per_group=1), INT4,
                                dict(num_warps=8)),
    # Pipelined by Triton: cp.async waits make two barriers a step (named off test_sass_loops' barrier-free list).
    "int4 pipelined rows gemv": (int4_gemv_rows._int4_gemv_rows_kernel, dict(BLOCK_N=8, SPLIT=8, HAS_BIAS=False,
                                 PACKED=True, ASM=True, PDL=True, PREFETCH=False, STAGES=3, blocks_per_group=1), INT4,
                                 dict(num_warps=8)),
    "int4 gemv rows float": (int4_gemv_rows._int4_gemv_rows_kernel, dict(BLOCK_N=8, SPLIT=8, HAS_BIAS=False,
                             PACKED=False, ASM=True, PDL=True, PREFETCH=False, STAGES=1, blocks_per_group=1), INT4, dict(num_warps=8)),
    "int4 gemv dp4a": (int4_gemv_dp4a._int4_gemv_dp4a_kernel, dict(BLOCK_N=4, SPLIT=16, HAS_BIAS=False, ASM=True, EVEN=True,
                       PDL=True, blocks_per_group=1), dict(INT4, q_ptr="*i32", xs_ptr="*fp32", xsum_ptr="*i32"),
                       dict(num_warps=4)),
    "int8 activations int4 order": (int8_activations._quantize_kernel, dict(SIZE=128, WORDS=32, WORD_STRIDE=1,
                                    BYTE_STRIDE=32, BLOCKS=4, GROUP=0, PDL=True),
                                    {"q_ptr": "*i32", "scale_ptr": "*fp32", "sum_ptr": "*i32"}, dict(num_warps=1)),
    "int8 activations natural order": (int8_activations._quantize_kernel, dict(SIZE=32, WORDS=8, WORD_STRIDE=4,
                                       BYTE_STRIDE=1, BLOCKS=4, GROUP=4, PDL=True),
                                       {"q_ptr": "*i32", "scale_ptr": "*fp32", "sum_ptr": "*i32",
                                        "group_scale_ptr": "*fp32", "group_sum_ptr": "*fp32"}, dict(num_warps=1)),
    "fp8 gemv rows": (fp8_gemv_rows._fp8_gemv_rows_kernel, dict(BLOCK_N=32, SPLIT=2, HAS_BIAS=False, ASM=True, PDL=True),
                      {"w_ptr": FP8, "scale_ptr": "*fp32"}, dict(num_warps=4)),
    "gguf q4k pairs gemv": (gguf_q4k_pairs._q4k_pairs_kernel, dict(BLOCK_N=32, SPLIT=1, ASM=True, PDL=True, STAGES=1),
                            {"w_ptr": "*u8", "row_bytes": "i32"}, dict(num_warps=4)),
    "gguf q4k dp4a gemv": (gguf_q4k_dp4a._q4k_dp4a_kernel, dict(BLOCK_N=4, SPLIT=4, ASM=True, PDL=True),
                           {"w_ptr": "*u8", "row_bytes": "i32", "q_ptr": "*i32", "gs_ptr": "*fp32", "gsum_ptr": "*fp32"},
                           dict(num_warps=4)),
    "gguf pipelined q4k pairs gemv": (gguf_q4k_pairs._q4k_pairs_kernel, dict(BLOCK_N=8, SPLIT=2, ASM=True, PDL=True,
                                      STAGES=3), {"w_ptr": "*u8", "row_bytes": "i32"}, dict(num_warps=4)),
    "gguf q6k pairs gemv": (gguf_q6k_pairs._q6k_pairs_kernel, dict(BLOCK_N=8, SPLIT=4, ASM=True, PDL=True, STAGES=1),
                            {"w_ptr": "*u8", "row_bytes": "i32"}, dict(num_warps=4)),
    "int8 gemv": (int4_triton._grouped_gemv_kernel, dict(BITS=8, P=16, BLOCK_M=2, BLOCK_N=4, BLOCKS=4, HAS_BIAS=True,
                  ROW_GROUPS=1, PLANE_SCALES=True, PDL=False),
                  {"w_ptr": "*i32", "z_ptr": "*i16"}, {}),
    "int4 mm": (int4_mm_triton._grouped_mm_kernel, dict(MM, BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, SPLIT_K=1,
                WHOLE_GROUPS=True, HAS_BIAS=False), INT4, dict(num_stages=3)),
    "int4 mm wide": (int4_mm_triton._grouped_mm_kernel, dict(MM, BLOCK_M=128, BLOCK_N=256, BLOCK_K=128, SPLIT_K=1,
                     WHOLE_GROUPS=True, HAS_BIAS=False), INT4, dict(num_warps=8, num_stages=3)),
    "int4 mm split": (int4_mm_triton._grouped_mm_kernel, dict(MM, BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, SPLIT_K=4,
                      WHOLE_GROUPS=False, HAS_BIAS=True), dict(INT4, out_ptr="*fp32"), dict(num_stages=4)),
    "int4 mm swap": (int4_mm_triton._grouped_mm_kernel, dict(MM, BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, SPLIT_K=2,
                     WHOLE_GROUPS=True, HAS_BIAS=False, SWAP_AB=True), dict(INT4, out_ptr="*fp32"), dict(num_stages=4)),
    # The weight tile in bfloat16 pairs (int4_pairs_tile), as one token would run it (mma.sync).
    "int4 mm pairs": (int4_mm_triton._grouped_mm_kernel, dict(MM, BLOCK_M=16, BLOCK_N=128, BLOCK_K=256, SPLIT_K=2,
                      WHOLE_GROUPS=True, HAS_BIAS=False, PAIRS=True), dict(INT4, out_ptr="*fp32"), dict(num_stages=3)),
    "int8 mm": (int4_mm_triton._grouped_mm_kernel, dict(MM, BITS=8, BLOCK_M=32, BLOCK_N=64, BLOCK_K=128, SPLIT_K=1,
                WHOLE_GROUPS=True, HAS_BIAS=True), {"w_ptr": "*i32", "z_ptr": "*i16"}, dict(num_stages=3)),
    "sum splits": (int4_mm_triton._sum_splits_kernel, dict(SPLIT_K=4, BLOCK=1024, HAS_BIAS=True), {"ws_ptr": "*fp32"}, {}),
    "int4 dequant": (int4_mm_triton._grouped_dequant_kernel, dict(BITS=4, P=16, BLOCK_N=32, BLOCK_K=512,
                     WHOLE_GROUPS=True), INT4, {}),
    "int4 dequant small groups": (int4_mm_triton._grouped_dequant_kernel, dict(BITS=4, P=16, BLOCK_N=16, BLOCK_K=1024,
                                  WHOLE_GROUPS=False), INT4, dict(num_warps=8)),
    "fp8 quantize": (fp8_triton._quantize_rows_kernel, dict(BLOCK=2048, QMAX=448.0, MIN_SCALE=1e-12, PRE_ROUND=False),
                     {"q_ptr": FP8, "scale_ptr": "*fp32"}, {}),
    "fp8 norm quantize": (fp8_fused._add_rms_norm_quant_kernel, dict(HIDDEN=4096, BLOCK=4096, QMAX=448.0, MIN_SCALE=1e-12,
                          PRE_ROUND=False), {"q_ptr": FP8, "scale_ptr": "*fp32", "weight_ptr": "*bf16", "eps": "fp32"},
                          dict(num_warps=8)),
    "fp8 silu quantize": (fp8_fused._silu_and_mul_quant_kernel, dict(INTERMEDIATE=14336, BLOCK=16384, QMAX=448.0,
                          MIN_SCALE=1e-12, PRE_ROUND=False), {"q_ptr": FP8, "scale_ptr": "*fp32"}, dict(num_warps=16)),
    "fp8 gemv": (gemv._gemv_kernel, dict(BLOCK_M=1, BLOCK_N=4, BLOCK_K=2048, HAS_BIAS=False, GATED=False, ACT=0,
                 DEFER_REDUCE=True, EVEN_K=True, HAS_SCALE=True, PREFETCH=False, STAGES=1, PDL=False),
                 {"w_ptr": FP8, "scale_ptr": "*fp32"}, {}),
    # Pipelined by Triton (GemvConfig.pipelined): the loop's loads through shared memory.
    "fp8 gemv pipelined": (gemv._gemv_kernel, dict(BLOCK_M=1, BLOCK_N=8, BLOCK_K=1024, HAS_BIAS=False, GATED=False,
                           ACT=0, DEFER_REDUCE=True, EVEN_K=True, HAS_SCALE=True, PREFETCH=False, STAGES=3, PDL=True),
                           {"w_ptr": FP8, "scale_ptr": "*fp32"}, {}),
    "skinny w8a8": (skinny_8bit._skinny_kernel, dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, SPLIT_K=4, X_SCALED=True,
                    DOT_DTYPE=None, PRECISION=None, PDL=True),
                    {"x_ptr": FP8, "xs_ptr": "*fp32", "w_ptr": FP8, "ws_ptr": "*fp32", "out_ptr": "*fp32"}, dict(num_stages=4)),
    "skinny weight-only": (skinny_8bit._skinny_kernel, dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, SPLIT_K=1,
                           X_SCALED=False, DOT_DTYPE=tl.bfloat16, PRECISION=None, PDL=False),
                           {"w_ptr": FP8, "ws_ptr": "*fp32"}, dict(num_stages=4)),
    "fp8 block gemv": (fp8_block_triton._block_gemv_kernel, dict(GROUP_N=128, GROUP_K=128, BLOCK_M=1, BLOCK_N=4, STEPS=8,
                       HAS_BIAS=False, EVEN_K=True), {"w_ptr": FP8, "s_ptr": "*fp32"}, {}),
    "fp8 block mm": (fp8_block_triton._block_scaled_mm_kernel, dict(GROUP_N=128, GROUP_K=128, BLOCK_M=64, BLOCK_N=128,
                     GROUP_M=8, HAS_BIAS=False, UPCAST=False),
                     {"a_ptr": FP8, "w_ptr": FP8, "a_scale_ptr": "*fp32", "w_scale_ptr": "*fp32"}, dict(num_stages=3)),
}
def compile_for(fn, signature: dict, constexprs: dict, capability: int, **options):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    try:
        import triton.backends.nvidia  # noqa: F401
    except ImportError:
        pytest.skip("Triton has no NVIDIA backend here")
    # Pointers, strides and GGUF row lengths (2,304 bytes at K = 4,096 for Q4_K)
    # 16-divisible, as Triton specialises them at launch.
    aligned = [n for n in fn.arg_names
               if (n.endswith("_ptr") or n.startswith("stride_") or n == "row_bytes") and n not in constexprs]
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    kernel = triton.compile(source, target=GPUTarget("cuda", capability, 32), options=options)
    assert "cubin" in kernel.asm


@compiled_here
@pytest.mark.parametrize("name", list(QUANT_KERNELS))
def test_quant_kernels_compile_for_hopper(name):
    kernel, constexprs, pointers, options = QUANT_KERNELS[name]
    compile_for(kernel, signature(kernel, constexprs, pointers), constexprs, 90, **options)


@compiled_here
@pytest.mark.parametrize("name", ["int4 gemv", "int4 mm", "int4 dequant"])
def test_int4_kernels_compile_for_ampere(name):
    kernel, constexprs, pointers, options = QUANT_KERNELS[name]
    compile_for(kernel, signature(kernel, constexprs, pointers), constexprs, 80, **options)


@compiled_here
@pytest.mark.parametrize("type_name", list(gguf_triton._CODES))
def test_gguf_kernels_compile(type_name):
    a, b = gguf_triton._PLANES[type_name]
    types = dict(TYPE=gguf_triton._CODES[type_name], A=a, B=b, SB_BYTES=144)
    pointers = {"w_ptr": "*u8"}
    kernels = [(gguf_triton._gguf_gemv_kernel, dict(types, BLOCK_M=2, BLOCK_N=4, STEPS=2), {}),
               (gguf_triton._gguf_gemv_one_kernel, dict(types, BLOCK_N=8, STEPS=1, PDL=False), dict(num_warps=1)),
               (gguf_triton._gguf_gemv_one_kernel, dict(types, BLOCK_N=8, STEPS=1, PDL=True), dict(num_warps=1))]
    if type_name in ("Q4_K", "Q6_K"):  # the other kernels share the dequantizer: two plane shapes suffice
        kernels += [
            (gguf_triton._gguf_mm_kernel, dict(types, BLOCK_M=32, BLOCK_N=64, GROUP_M=8, DOT_DTYPE=tl.bfloat16,
                                               PRECISION=None), dict(num_stages=2)),
            (gguf_triton._gguf_dequant_kernel, dict(types, BLOCK_N=16), {}),
        ]
    for kernel, constexprs, options in kernels:
        compile_for(kernel, signature(kernel, constexprs, pointers), constexprs, 90, **options)
