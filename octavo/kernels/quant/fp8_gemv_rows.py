"""The one-token fp8 (e4m3) weight-only GEMV with activations shared by rows
(issue 17).

``gemv.py``'s 8-bit form loads the activations once per weight row (so that
their loads take the weights' layout) and widens each one to float32 per
row: 4.7 sm_90 instructions a weight value, the fp8 batch-1 decode's
largest cost. Here a row's weights are 32-bit words (four values), 32 of
them a 128-value chunk; a program takes ``BLOCK_N`` rows and ``SPLIT``
chunks a step, shaped ``[BLOCK_N, SPLIT, 32]``, and the chunk's activations
are loaded as ``[SPLIT, 32]`` 64-bit words, widened to four float32 vectors
once and broadcast over the rows (a thread's rows share them in registers).
A word's four products (``_WORD_ASM``): two ``cvt.rn.f16x2.e4m3x2`` (two
values each), four half-to-float conversions and four ``fma`` in float32 --
the weight exact, the sums float32, as in the general form. Chunks past K
read chunk 0 as zero weights, so the loop has no masked load. The
interpreter runs a plain-arithmetic twin (e4m3 decoded with its exponent
moved into float32's).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from octavo.env_switches import switch_from_env
from octavo.kernels.pdl import pdl_enabled, pdl_release, pdl_wait
from octavo.kernels.quant.bf16_pairs import bf16_half
from octavo.kernels.triton_utils import interpreting, ints_from_env, runs_ptx

CHUNK = 128  # weight values a 32-word lane row covers


@dataclass(frozen=True)
class Fp8RowsTiles:
    block_n: int  # rows a program
    split: int  # 128-value chunks a step
    num_warps: int


# Swept on the H200 (round 35, one 8B layer's four GEMVs): 145.3 us at the best
# tiles (32, 2, 8), 212.5 at these; gemv.py's 8-bit form 98.9 in the same run.
# Fewer instructions a value did not make it faster: off by default (rows_enabled).
# With fewer rows than threads along them (16 rows, 4 chunks, 4 warps) the
# activations changed layout through shared memory every step (8 barriers).
TILES = Fp8RowsTiles(block_n=32, split=2, num_warps=4)


@functools.cache
def tiles_from_env() -> Fp8RowsTiles | None:
    """``OCTAVO_FP8_GEMV_ROWS_TILES=block_n,split,num_warps`` (tuning runs), else None."""
    parts = ints_from_env("OCTAVO_FP8_GEMV_ROWS_TILES", "block_n,split,num_warps", (3,))
    return None if parts is None else Fp8RowsTiles(*parts)


@functools.cache
def rows_enabled() -> bool:
    """``OCTAVO_FP8_GEMV_ROWS=1`` sends one-token fp8 calls here; by default (0)
    they take ``gemv.py``'s 8-bit form, which the H200 ran faster (round 35:
    98.9 against 145-213 us a layer, batch-1 decode 2.88 against 6.31 ms)."""
    return switch_from_env("OCTAVO_FP8_GEMV_ROWS", default=False)


# $1 a word of four e4m3 values, $2-$5 their activations in float32; $0 the sum of products.
_WORD_ASM = tl.constexpr("""{
.reg .b16 lo, hi, a, b, c, d;
.reg .b32 h01, h23;
.reg .f32 w0, w1, w2, w3;
mov.b32 {lo, hi}, $1;
cvt.rn.f16x2.e4m3x2 h01, lo;
cvt.rn.f16x2.e4m3x2 h23, hi;
mov.b32 {a, b}, h01;
mov.b32 {c, d}, h23;
cvt.f32.f16 w0, a;
cvt.f32.f16 w1, b;
cvt.f32.f16 w2, c;
cvt.f32.f16 w3, d;
mul.rn.f32 $0, w0, $2;
fma.rn.f32 $0, w1, $3, $0;
fma.rn.f32 $0, w2, $4, $0;
fma.rn.f32 $0, w3, $5, $0;
}""")


@triton.jit
def _e4m3_f32(byte):
    """float32 of an e4m3 value's bits (uint32 in [0, 256)): the exponent moved into
    float32's (bias 7 -> 127) for normal values, ``m * 2**-9`` for subnormal ones."""
    sign = (byte & 0x80) << 24
    exponent = (byte >> 3) & 15
    mantissa = byte & 7
    normal = (sign | ((exponent + 120) << 23) | (mantissa << 20)).to(tl.float32, bitcast=True)
    subnormal = mantissa.to(tl.float32) * 0.001953125
    return tl.where(exponent == 0, tl.where(sign != 0, -subnormal, subnormal), normal)


@triton.jit
def _word_dot(words, x0, x1, x2, x3, ASM: tl.constexpr):
    """Each word's four products summed, float32."""
    if ASM:
        return tl.inline_asm_elementwise(_WORD_ASM, "=f,r,f,f,f,f", [words, x0, x1, x2, x3], dtype=tl.float32,
                                         is_pure=True, pack=1)
    return (_e4m3_f32(words & 0xFF) * x0 + _e4m3_f32((words >> 8) & 0xFF) * x1
            + _e4m3_f32((words >> 16) & 0xFF) * x2 + _e4m3_f32(words >> 24) * x3)


@triton.jit
def _fp8_gemv_rows_kernel(
    x_ptr, w_ptr, scale_ptr, b_ptr, out_ptr, N, K, stride_wn,
    BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, ASM: tl.constexpr, PDL: tl.constexpr,
):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    rows = tl.where(mask_n, offs_n, 0).to(tl.int64)
    # A chunk's 32 words as [4, 8] (a thread holds four consecutive words): shaped so, the
    # activations' loads take the words' layout (as [SPLIT, 32] they changed layout through
    # shared memory every step; tests/kernels/sass_loops.py).
    lanes = 8 * tl.arange(0, 4)[:, None] + tl.arange(0, 8)[None, :]  # [4, 8]
    w_rows = w_ptr.to(tl.pointer_type(tl.uint32)) + rows[:, None, None, None] * (stride_wn // 4) + lanes[None, None]
    x_quads = x_ptr.to(tl.pointer_type(tl.uint64)) + lanes[None]  # [1, 4, 8]
    chunks = tl.arange(0, SPLIT) * 128
    acc = tl.zeros((BLOCK_N, SPLIT, 4, 8), dtype=tl.float32)
    pdl_wait(PDL)  # the activations come from the kernel before (octavo/kernels/pdl.py)
    for k0 in range(0, K, SPLIT * 128):
        start = k0 + chunks
        valid = start < K
        start = tl.multiple_of(tl.where(valid, start, 0), 128)
        # Chunks past K: zero weights (e4m3 0x00 is 0.0) against chunk 0's activations.
        words = tl.where(valid[None, :, None, None], tl.load(w_rows + (start // 4)[None, :, None, None]), 0)
        quads = tl.load(x_quads + (start // 4)[:, None, None])  # [SPLIT, 4, 8]
        low = quads.to(tl.uint32)
        high = (quads >> 32).to(tl.uint32)
        x0, x1 = bf16_half(low, False)[None], bf16_half(low, True)[None]
        x2, x3 = bf16_half(high, False)[None], bf16_half(high, True)[None]
        acc += _word_dot(words, x0, x1, x2, x3, ASM)
    pdl_release(PDL)
    out = tl.sum(tl.sum(tl.sum(acc, axis=3), axis=2), axis=1) * tl.load(scale_ptr + rows)
    if HAS_BIAS:
        out += tl.load(b_ptr + rows).to(tl.float32)
    tl.store(out_ptr + offs_n, out.to(out_ptr.dtype.element_ty), mask=mask_n)


def takes(x: torch.Tensor, qweight: torch.Tensor) -> bool:
    """One bfloat16 token, an e4m3 weight with whole 128-value chunks, where the PTX runs
    (CUDA; the interpreter runs the twin)."""
    return (x.shape[0] == 1 and x.dtype == torch.bfloat16 and qweight.dtype == torch.float8_e4m3fn
            and qweight.shape[1] % CHUNK == 0 and qweight.stride(1) == 1 and x.stride(1) == 1
            # 64-bit activation loads and 32-bit weight loads
            and x.data_ptr() % 8 == 0 and qweight.data_ptr() % 4 == 0 and qweight.stride(0) % 4 == 0
            and (runs_ptx(x.device) or interpreting()) and rows_enabled())


def fp8_gemv_rows(x, qweight, weight_scale, bias, tiles: Fp8RowsTiles | None = None) -> torch.Tensor:
    """``x @ (qweight * weight_scale[:, None]).T + bias`` for one token (``takes``)."""
    tiles = tiles or tiles_from_env() or TILES
    num_out, num_in = qweight.shape
    out = torch.empty(1, num_out, dtype=x.dtype, device=x.device)
    if num_out == 0:
        return out
    pdl = pdl_enabled(x.device, 1)
    asm = runs_ptx(x.device)
    _fp8_gemv_rows_kernel[(triton.cdiv(num_out, tiles.block_n),)](
        x, qweight, weight_scale, bias if bias is not None else x, out, num_out, num_in, qweight.stride(0),
        BLOCK_N=tiles.block_n, SPLIT=tiles.split, HAS_BIAS=bias is not None, ASM=asm, PDL=pdl,
        num_warps=tiles.num_warps, launch_pdl=pdl,
    )
    return out
