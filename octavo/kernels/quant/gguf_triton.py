"""GGUF (ggml) quantized linear layers in Triton, for Q8_0, Q4_0, Q4_1, Q4_K,
Q5_K and Q6_K (layouts in ``gguf_dequant``; the other quantized types
dequantize in torch and take the dense matmul).

The weight stays as the file's raw rows (uint8 ``[N, row_bytes]``). Every
kernel walks a row 256 values at a time (one K-quant super-block, or eight
32-value blocks) and ``_planes`` turns those bytes into two float32 tiles
``[BLOCK_N, A, B]`` ("planes", ``A * B = 128``), each byte read once:
the low and high nibbles of the same bytes (the high/low halves of each
block for Q8_0; Q6_K's 2-bit high parts come from a second run of bytes).
Each plane's values correspond to inputs ``k_lo`` / ``k_hi`` (``_plane_k``),
which the kernels read the activations at -- the values are never
shuffled back into input order. Scales are read once per sub-block
(``[BLOCK_N, A]``) and broadcast.

* ``_gguf_gemv_kernel`` (a few tokens, decode; one bfloat16 token of Q4_K
  or Q6_K goes to ``gguf_q4k_pairs`` or ``gguf_q6k_pairs`` instead): float32 products on the CUDA cores,
  ``STEPS`` super-blocks per loop iteration so that enough loads are in
  flight, one reduction at the end.
* ``_gguf_mm_kernel`` (more tokens): each plane flattened to ``[BLOCK_N,
  128]`` in the activation dtype and multiplied on the tensor cores.
* ``_gguf_dequant_kernel`` (prefill): the dense weight, then cuBLAS.

Tile shapes and crossovers are parameters with defaults (``GEMV_CONFIG``,
``MM_CONFIG``, ``GEMV_MAX_TOKENS``, ``DEQUANT_MIN_TOKENS``), swept by
``benchmarks/quant_sweep_gpu.py``. Tested bit-exact (the dequantizer) and
within the GEMM tolerance (the matmuls) against ``gguf_dequant`` through
Triton's interpreter.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from octavo.kernels.pdl import pdl_enabled, pdl_release, pdl_wait
from octavo.kernels.quant import gguf_q4k_dp4a, gguf_q4k_pairs, gguf_q6k_pairs
from octavo.kernels.quant.gguf_dequant import GGMLType, dequantize_gguf
from octavo.kernels.tile_order import program_tile
from octavo.kernels.triton_utils import dot_dtype, dot_precision, ints_from_env, next_power_of_2

# Type codes inside the kernels (constexpr) and their plane shapes (A, B).
_CODES = {"Q8_0": 0, "Q4_0": 1, "Q4_1": 2, "Q4_K": 3, "Q5_K": 4, "Q6_K": 5}
_PLANES = {"Q8_0": (8, 16), "Q4_0": (8, 16), "Q4_1": (8, 16), "Q4_K": (4, 32), "Q5_K": (4, 32), "Q6_K": (8, 16)}
FUSED_TYPES = tuple(_CODES)


@dataclass(frozen=True)
class GGUFGemvConfig:
    block_n: int = 4
    steps: int = 2  # super-blocks per loop iteration
    num_warps: int = 4


@dataclass(frozen=True)
class GGUFMmConfig:
    block_m: int = 32
    block_n: int = 64
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 2


GEMV_CONFIG = GGUFGemvConfig()
# Swept on the H200 (round 26), one 8B decoder layer: Q4_K 537 -> 500 us, Q6_K 246 -> 227 us.
GEMV_CONFIG_BY_TYPE = {"Q4_K": GGUFGemvConfig(4, 1, 4), "Q6_K": GGUFGemvConfig(8, 1, 4)}
MM_CONFIG = GGUFMmConfig()
GEMV_MAX_TOKENS = 4
DEQUANT_MIN_TOKENS = 256


@triton.jit
def _u8(ptr, mask):
    return tl.load(ptr, mask=mask, other=0).to(tl.int32)


@triton.jit
def _f16(ptr, mask):
    bits = _u8(ptr, mask) | (_u8(ptr + 1, mask) << 8)
    return bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _small_int_f32(q, offset: tl.constexpr):
    """``q - offset`` in float32 for int32 ``q`` in ``[0, 2**23)``, exactly:
    ``0x4B000000 | q`` is the float ``2**23 + q``. One OR and one add at the
    full FMA rate, where an int-to-float conversion runs at an eighth of
    it on sm_80/sm_90 (16 results a clock per SM against 128; the CUDA
    guide's throughput table): it was one conversion per weight value."""
    return (q | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + offset)


@triton.jit
def _k_scale_min(scales_ptr, sub, mask):
    """Q4_K/Q5_K: the 6-bit (scale, min) of sub-block ``sub`` (0..7)."""
    a = _u8(scales_ptr + sub, mask)
    b = _u8(scales_ptr + sub + 4, mask)
    c = _u8(scales_ptr + tl.where(sub >= 4, sub - 4, sub), mask)
    sc = tl.where(sub < 4, a & 63, (b & 0xF) | ((c >> 6) << 4))
    mn = tl.where(sub < 4, b & 63, (b >> 4) | ((a >> 6) << 4))
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def _plane_k(TYPE: tl.constexpr, A: tl.constexpr, B: tl.constexpr):
    """Inputs (within the super-block) of each plane's ``[A, B]`` values."""
    a = tl.arange(0, A)[:, None]
    b = tl.arange(0, B)[None, :]
    if TYPE <= 2:  # 32-value blocks: a block's first 16 values, then its last 16
        k_lo = 32 * a + b
        k_hi = k_lo + 16
    elif TYPE <= 4:  # Q4_K/Q5_K: 64-value chunks, low nibbles then high nibbles
        k_lo = 64 * a + b
        k_hi = k_lo + 32
    else:  # Q6_K: a = 4 * half + s, low nibbles for 64 values then high nibbles
        k_lo = 128 * (a // 4) + 16 * (a % 4) + b
        k_hi = k_lo + 64
    return k_lo, k_hi


@triton.jit
def _planes(base, mask_n, num_blocks, TYPE: tl.constexpr, A: tl.constexpr, B: tl.constexpr):
    """float32 ``[BLOCK_N, A, B]`` low and high planes of one super-block at
    ``base`` (``[BLOCK_N]`` byte pointers). ``num_blocks``: how many of the
    ``A`` 32-value blocks exist (a row's last super-block may be partial)."""
    a2 = tl.arange(0, A)[None, :]
    a3 = a2[:, :, None]
    b3 = tl.arange(0, B)[None, None, :]
    base2 = base[:, None]
    base3 = base2[:, :, None]
    mask2 = mask_n[:, None] & (a2 < num_blocks)
    mask3 = mask2[:, :, None]
    if TYPE == 0:  # Q8_0: f16 d, 32 x int8
        blk = base3 + a3 * 34
        d = _f16(base2 + a2 * 34, mask2)[:, :, None]
        # int8 as stored: flipping the sign bit offsets it by 128 into [0, 256).
        lo = _small_int_f32(_u8(blk + 2 + b3, mask3) ^ 0x80, 128.0) * d
        hi = _small_int_f32(_u8(blk + 18 + b3, mask3) ^ 0x80, 128.0) * d
    elif TYPE == 1:  # Q4_0: f16 d, 16 bytes of nibbles; w = d (q - 8)
        d = _f16(base2 + a2 * 18, mask2)[:, :, None]
        qs = _u8(base3 + a3 * 18 + 2 + b3, mask3)
        lo = _small_int_f32(qs & 0xF, 8.0) * d
        hi = _small_int_f32(qs >> 4, 8.0) * d
    elif TYPE == 2:  # Q4_1: f16 d, f16 m, nibbles; w = d q + m
        d = _f16(base2 + a2 * 20, mask2)[:, :, None]
        m = _f16(base2 + a2 * 20 + 2, mask2)[:, :, None]
        qs = _u8(base3 + a3 * 20 + 4 + b3, mask3)
        lo = _small_int_f32(qs & 0xF, 0.0) * d + m
        hi = _small_int_f32(qs >> 4, 0.0) * d + m
    elif TYPE <= 4:  # Q4_K / Q5_K: sub-block 2a = low nibbles of chunk a, 2a + 1 = high
        d = _f16(base, mask_n)[:, None]
        dmin = _f16(base + 2, mask_n)[:, None]
        sc_lo, mn_lo = _k_scale_min(base2 + 4, 2 * a2, mask2)
        sc_hi, mn_hi = _k_scale_min(base2 + 4, 2 * a2 + 1, mask2)
        qs_offset: tl.constexpr = 16 if TYPE == 3 else 48
        qs = _u8(base3 + qs_offset + 32 * a3 + b3, mask3)
        q_lo = qs & 0xF
        q_hi = qs >> 4
        if TYPE == 4:  # fifth bits: bit (sub-block) of qh[l]
            qh = _u8(base3 + 16 + b3, mask3)
            q_lo |= ((qh >> (2 * a3)) & 1) << 4
            q_hi |= ((qh >> (2 * a3 + 1)) & 1) << 4
        lo = (d * sc_lo)[:, :, None] * _small_int_f32(q_lo, 0.0) - (dmin * mn_lo)[:, :, None]
        hi = (d * sc_hi)[:, :, None] * _small_int_f32(q_hi, 0.0) - (dmin * mn_hi)[:, :, None]
    else:  # Q6_K: ql[128], qh[64], int8 scales[16], f16 d; w = d sc (q - 32)
        half = a3 // 4
        s = a3 % 4
        ql = _u8(base3 + 64 * half + 16 * s + b3, mask3)
        qh = _u8(base3 + 128 + 32 * half + 16 * (s % 2) + b3, mask3)
        shift = 2 * (s // 2)
        q_lo = (ql & 0xF) | (((qh >> shift) & 3) << 4)  # 6 bits, stored + 32
        q_hi = (ql >> 4) | (((qh >> (shift + 4)) & 3) << 4)
        d = _f16(base + 208, mask_n)[:, None]
        half2 = a2 // 4
        s2 = a2 % 4
        sc_lo = tl.load(base2 + 192 + 8 * half2 + s2, mask=mask2, other=0).to(tl.int8, bitcast=True).to(tl.float32)
        sc_hi = tl.load(base2 + 196 + 8 * half2 + s2, mask=mask2, other=0).to(tl.int8, bitcast=True).to(tl.float32)
        lo = (d * sc_lo)[:, :, None] * _small_int_f32(q_lo, 32.0)
        hi = (d * sc_hi)[:, :, None] * _small_int_f32(q_hi, 32.0)
    return lo, hi


@triton.jit(do_not_specialize=["M"])
def _gguf_gemv_kernel(
    x_ptr, w_ptr, out_ptr, M, N, K, row_bytes, stride_xm, stride_om,
    TYPE: tl.constexpr, A: tl.constexpr, B: tl.constexpr, SB_BYTES: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEPS: tl.constexpr,
):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    row_ptr = w_ptr + tl.where(mask_n, offs_n, 0).to(tl.int64) * row_bytes
    offs_m = tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    k_lo, k_hi = _plane_k(TYPE, A, B)
    x_rows = x_ptr + offs_m[:, None, None] * stride_xm
    num_sb = tl.cdiv(K, 256)
    acc = tl.zeros((BLOCK_M, BLOCK_N, A, B), dtype=tl.float32)
    for sb0 in range(0, num_sb, STEPS):
        for step in tl.static_range(STEPS):
            # Steps past the row's end re-read its last super-block with
            # zero activations; a partial super-block masks its missing blocks.
            sb = tl.minimum(sb0 + step, num_sb - 1)
            live = sb0 + step < num_sb
            first = sb * 256
            lo, hi = _planes(row_ptr + sb * SB_BYTES, mask_n, (K - first) // 32, TYPE, A, B)
            limit = tl.where(live, K, 0)
            x_lo = tl.load(x_rows + (first + k_lo)[None], mask=mask_m[:, None, None] & (first + k_lo < limit)[None], other=0.0)
            x_hi = tl.load(x_rows + (first + k_hi)[None], mask=mask_m[:, None, None] & (first + k_hi < limit)[None], other=0.0)
            acc += x_lo.to(tl.float32)[:, None] * lo[None] + x_hi.to(tl.float32)[:, None] * hi[None]
    out = tl.sum(tl.sum(acc, axis=3), axis=2)
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], out.to(out_ptr.dtype.element_ty),
             mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _gguf_gemv_one_kernel(
    x_ptr, w_ptr, out_ptr, N, K, row_bytes,
    TYPE: tl.constexpr, A: tl.constexpr, B: tl.constexpr, SB_BYTES: tl.constexpr,
    BLOCK_N: tl.constexpr, STEPS: tl.constexpr, PDL: tl.constexpr,
):
    """``_gguf_gemv_kernel`` for one token and whole steps (``K`` a multiple
    of ``256 * STEPS``, as every model's is): no mask along K, so every load
    is a vector, and the activations are read per weight row (from L1) as
    ``[BLOCK_N, A, B]`` tiles, the planes' own shape, so that they take the
    planes' layout: the sm_90 loop changes no layout (the general kernel's
    1-token Q4_K loop: 8 barriers a step; sass_loops)."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    row_ptr = w_ptr + tl.where(mask_n, offs_n, 0).to(tl.int64) * row_bytes
    k_lo, k_hi = _plane_k(TYPE, A, B)
    x_rows = x_ptr + tl.zeros((BLOCK_N, 1, 1), dtype=tl.int32)
    acc = tl.zeros((BLOCK_N, A, B), dtype=tl.float32)
    pdl_wait(PDL)  # the activation comes from the kernel before (octavo/kernels/pdl.py)
    for sb0 in range(0, K // 256, STEPS):
        for step in tl.static_range(STEPS):
            first = (sb0 + step) * 256
            lo, hi = _planes(row_ptr + (sb0 + step) * SB_BYTES, mask_n, A, TYPE, A, B)
            x_lo = tl.load(x_rows + (first + k_lo)[None]).to(tl.float32)
            acc += x_lo * lo + tl.load(x_rows + (first + k_hi)[None]).to(tl.float32) * hi
    pdl_release(PDL)
    out = tl.sum(tl.sum(acc, axis=2), axis=1)
    tl.store(out_ptr + offs_n, out.to(out_ptr.dtype.element_ty), mask=mask_n)


@triton.jit(do_not_specialize=["M"])
def _gguf_mm_kernel(
    x_ptr, w_ptr, out_ptr, M, N, K, row_bytes, stride_xm, stride_om,
    TYPE: tl.constexpr, A: tl.constexpr, B: tl.constexpr, SB_BYTES: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
    DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
):
    offs_m, offs_n, mask_m, mask_n, rows_m, rows_n = program_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    row_ptr = w_ptr + rows_n * row_bytes
    x_rows = x_ptr + rows_m[:, None, None] * stride_xm
    k_lo, k_hi = _plane_k(TYPE, A, B)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for sb in range(0, tl.cdiv(K, 256)):
        first = sb * 256
        lo, hi = _planes(row_ptr + sb * SB_BYTES, mask_n, (K - first) // 32, TYPE, A, B)
        x_lo = tl.load(x_rows + (first + k_lo)[None], mask=(first + k_lo < K)[None], other=0.0)
        x_hi = tl.load(x_rows + (first + k_hi)[None], mask=(first + k_hi < K)[None], other=0.0)
        w_lo = tl.reshape(lo.to(x_ptr.dtype.element_ty), (BLOCK_N, A * B))
        w_hi = tl.reshape(hi.to(x_ptr.dtype.element_ty), (BLOCK_N, A * B))
        acc = tl.dot(tl.reshape(x_lo, (BLOCK_M, A * B)).to(DOT_DTYPE), tl.trans(w_lo.to(DOT_DTYPE)), acc,
                     input_precision=PRECISION)
        acc = tl.dot(tl.reshape(x_hi, (BLOCK_M, A * B)).to(DOT_DTYPE), tl.trans(w_hi.to(DOT_DTYPE)), acc,
                     input_precision=PRECISION)
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _gguf_dequant_kernel(
    w_ptr, out_ptr, N, K, row_bytes, stride_on,
    TYPE: tl.constexpr, A: tl.constexpr, B: tl.constexpr, SB_BYTES: tl.constexpr, BLOCK_N: tl.constexpr,
):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    rows = tl.where(mask_n, offs_n, 0).to(tl.int64)
    sb = tl.program_id(1)
    first = sb * 256
    lo, hi = _planes(w_ptr + rows * row_bytes + sb * SB_BYTES, mask_n, (K - first) // 32, TYPE, A, B)
    k_lo, k_hi = _plane_k(TYPE, A, B)
    out_rows = out_ptr + rows[:, None, None] * stride_on + first
    tl.store(out_rows + k_lo[None], lo.to(out_ptr.dtype.element_ty), mask=mask_n[:, None, None] & (first + k_lo < K)[None])
    tl.store(out_rows + k_hi[None], hi.to(out_ptr.dtype.element_ty), mask=mask_n[:, None, None] & (first + k_hi < K)[None])


def _type_args(raw: torch.Tensor, ggml_type: GGMLType) -> tuple[int, int, dict]:
    """(N, K, the kernels' type constexprs) for raw rows of a fused type."""
    if ggml_type.name not in _CODES:
        raise ValueError(f"no Triton kernel for GGUF type {ggml_type.name}")
    if raw.dtype != torch.uint8 or raw.dim() != 2 or raw.stride(1) != 1:
        raise ValueError("GGUF weights must be uint8 [N, row_bytes] with contiguous rows")
    num_out, row_bytes = raw.shape
    a, b = _PLANES[ggml_type.name]
    sb_bytes = 256 // ggml_type.block_elems * ggml_type.block_bytes
    constexprs = dict(TYPE=_CODES[ggml_type.name], A=a, B=b, SB_BYTES=sb_bytes)
    return num_out, row_bytes // ggml_type.block_bytes * ggml_type.block_elems, constexprs


@functools.cache
def gemv_config_from_env(type_name: str) -> GGUFGemvConfig | None:
    """``OCTAVO_GGUF_GEMV_TILES_<TYPE>`` (e.g. ``_Q4_K``), else ``OCTAVO_GGUF_GEMV_TILES``:
    ``block_n,steps,num_warps`` for tuning runs; None when neither is set."""
    for name in (f"OCTAVO_GGUF_GEMV_TILES_{type_name}", "OCTAVO_GGUF_GEMV_TILES"):
        parts = ints_from_env(name, "block_n,steps,num_warps", (3,))
        if parts is not None:
            return GGUFGemvConfig(*parts)
    return None


def gguf_gemv(x: torch.Tensor, raw: torch.Tensor, ggml_type: GGMLType, config: GGUFGemvConfig | None = None):
    config = config or gemv_config_from_env(ggml_type.name) or GEMV_CONFIG_BY_TYPE.get(ggml_type.name, GEMV_CONFIG)
    num_out, num_in, constexprs = _type_args(raw, ggml_type)
    out = torch.empty(x.shape[0], num_out, dtype=x.dtype, device=x.device)
    if x.shape[0] == 0:
        return out
    grid = (triton.cdiv(num_out, config.block_n),)
    if x.shape[0] == 1 and num_in % (256 * config.steps) == 0:
        pdl = pdl_enabled(x.device, 1)
        _gguf_gemv_one_kernel[grid](
            x, raw, out, num_out, num_in, raw.stride(0), **constexprs,
            BLOCK_N=config.block_n, STEPS=config.steps, PDL=pdl, num_warps=config.num_warps, launch_pdl=pdl,
        )
        return out
    _gguf_gemv_kernel[grid](
        x, raw, out, x.shape[0], num_out, num_in, raw.stride(0), x.stride(0), out.stride(0), **constexprs,
        BLOCK_M=next_power_of_2(x.shape[0]), BLOCK_N=config.block_n, STEPS=config.steps, num_warps=config.num_warps,
    )
    return out


def gguf_mm(x: torch.Tensor, raw: torch.Tensor, ggml_type: GGMLType, config: GGUFMmConfig = MM_CONFIG):
    num_out, num_in, constexprs = _type_args(raw, ggml_type)
    num_tokens = x.shape[0]
    out = torch.empty(num_tokens, num_out, dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    grid = (triton.cdiv(num_tokens, config.block_m) * triton.cdiv(num_out, config.block_n),)
    _gguf_mm_kernel[grid](
        x, raw, out, num_tokens, num_out, num_in, raw.stride(0), x.stride(0), out.stride(0), **constexprs,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, GROUP_M=config.group_m,
        DOT_DTYPE=dot_dtype(x.dtype), PRECISION=dot_precision(x.dtype),
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out


def gguf_dequantize(raw: torch.Tensor, ggml_type: GGMLType, dtype: torch.dtype) -> torch.Tensor:
    """Raw ggml rows ``[N, row_bytes]`` -> dense ``[N, K]`` in ``dtype``, one launch."""
    num_out, num_in, constexprs = _type_args(raw, ggml_type)
    out = torch.empty(num_out, num_in, dtype=dtype, device=raw.device)
    block_n = 16
    grid = (triton.cdiv(num_out, block_n), triton.cdiv(num_in, 256))
    _gguf_dequant_kernel[grid](raw, out, num_out, num_in, raw.stride(0), out.stride(0), **constexprs, BLOCK_N=block_n)
    return out


def gguf_linear(x: torch.Tensor, raw: torch.Tensor, ggml_type: GGMLType) -> torch.Tensor:
    """The ``gguf_linear`` layer op on a GPU: ``x @ W.T`` for raw ggml rows ``[N, row_bytes]``."""
    if ggml_type.name not in _CODES:  # plain floats and the rarer quantized types: torch dequantizer
        return F.linear(x, dequantize_gguf(raw, ggml_type, x.dtype))
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    num_tokens = x2.shape[0]
    if gguf_q4k_dp4a.takes(x2, raw, ggml_type.name):
        out = gguf_q4k_dp4a.q4k_gemv_dp4a(x2, raw)
    elif gguf_q4k_pairs.takes(x2, raw, ggml_type.name):
        out = gguf_q4k_pairs.q4k_gemv_pairs(x2, raw)
    elif gguf_q6k_pairs.takes(x2, raw, ggml_type.name):
        out = gguf_q6k_pairs.q6k_gemv_pairs(x2, raw)
    elif num_tokens <= GEMV_MAX_TOKENS:
        out = gguf_gemv(x2, raw, ggml_type)
    elif num_tokens < DEQUANT_MIN_TOKENS:
        out = gguf_mm(x2, raw, ggml_type)
    else:
        out = F.linear(x2, gguf_dequantize(raw, ggml_type, x.dtype))
    return out.reshape(*x.shape[:-1], -1)
