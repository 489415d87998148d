"""GGUF dequantization in Triton: a fused dequant-GEMM and a dequantizer.

``_dequant_tile`` computes the weights ``W[n, k]`` of a ``[BLOCK_K, BLOCK_N]``
tile straight from the raw ggml bytes (layouts in ``gguf_dequant``): each
element finds its block (``k // block_elems``), gathers the bytes holding its
quant bits and its block's scales, and applies the type's formula in
float32. The gathers hit the same few bytes many times, which the cache
absorbs. ``gguf_matmul`` multiplies activations by such tiles (for small
batches); ``gguf_dequantize`` writes the whole weight (large batches then
use the dense matmul). Quantized types only: F32/F16/BF16 rows are plain
values and are handled in torch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from octavo.kernels.quant.gguf_dequant import GGMLType, dequantize_gguf
from octavo.kernels.quant.int4_triton import upcast_dot

# Type codes inside the kernels (constexpr).
_CODES = {"Q8_0": 0, "Q4_0": 1, "Q4_K": 2, "Q5_K": 3, "Q6_K": 4}


@triton.jit
def _byte(ptr, mask):
    return tl.load(ptr, mask=mask, other=0).to(tl.int32)


@triton.jit
def _f16(ptr, mask):
    bits = _byte(ptr, mask) | (_byte(ptr + 1, mask) << 8)
    return bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _k_scale_min(scales_ptr, sub, mask):
    """Q4_K/Q5_K: the 6-bit (scale, min) of sub-block ``sub`` (0..7)."""
    a = _byte(scales_ptr + sub, mask)
    b = _byte(scales_ptr + sub + 4, mask)
    c = _byte(scales_ptr + tl.where(sub >= 4, sub - 4, sub), mask)
    sc = tl.where(sub < 4, a & 63, (b & 0xF) | ((c >> 6) << 4))
    mn = tl.where(sub < 4, b & 63, (b >> 4) | ((a >> 6) << 4))
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def _k_quant(base, j, mask, QS_OFFSET: tl.constexpr, HIGH_BITS: tl.constexpr):
    """Q4_K (``HIGH_BITS`` False) / Q5_K value ``j`` of the block at ``base``."""
    sub = j // 32
    q = (_byte(base + QS_OFFSET + (j // 64) * 32 + j % 32, mask) >> ((sub % 2) * 4)) & 0xF
    if HIGH_BITS:
        q = q | (((_byte(base + 16 + j % 32, mask) >> sub) & 1) << 4)
    sc, mn = _k_scale_min(base + 4, sub, mask)
    return _f16(base, mask) * sc * q.to(tl.float32) - _f16(base + 2, mask) * mn


@triton.jit
def _dequant_tile(w_ptr, offs_k, offs_n, row_bytes, mask, TYPE: tl.constexpr):
    """float32 ``W[n, k]`` for the broadcast index tensors ``offs_k``, ``offs_n``."""
    if TYPE == 0:  # Q8_0
        base = w_ptr + offs_n * row_bytes + (offs_k // 32) * 34
        q = tl.load(base + 2 + offs_k % 32, mask=mask, other=0).to(tl.int8, bitcast=True)
        w = _f16(base, mask) * q.to(tl.float32)
    elif TYPE == 1:  # Q4_0
        base = w_ptr + offs_n * row_bytes + (offs_k // 32) * 18
        j = offs_k % 32
        q = (_byte(base + 2 + j % 16, mask) >> ((j // 16) * 4)) & 0xF
        w = _f16(base, mask) * (q - 8).to(tl.float32)
    elif TYPE == 2:  # Q4_K
        w = _k_quant(w_ptr + offs_n * row_bytes + (offs_k // 256) * 144, offs_k % 256, mask, 16, False)
    elif TYPE == 3:  # Q5_K
        w = _k_quant(w_ptr + offs_n * row_bytes + (offs_k // 256) * 176, offs_k % 256, mask, 48, True)
    else:  # Q6_K
        base = w_ptr + offs_n * row_bytes + (offs_k // 256) * 210
        j = offs_k % 256
        half = j // 128
        low = (_byte(base + half * 64 + j % 64, mask) >> (((j % 128) // 64) * 4)) & 0xF
        high = (_byte(base + 128 + half * 32 + j % 32, mask) >> (((j % 128) // 32) * 2)) & 3
        scale = tl.load(base + 192 + j // 16, mask=mask, other=0).to(tl.int8, bitcast=True).to(tl.float32)
        w = (_f16(base + 208, mask) * scale) * ((low | (high << 4)) - 32).to(tl.float32)
    return w


# M (tokens in the step) changes every step: not specialised on.
@triton.jit(do_not_specialize=["M"])
def _gguf_matmul_kernel(
    x_ptr, w_ptr, out_ptr, M, N, K, row_bytes, stride_xm, stride_om,
    TYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr,
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        offs_k = k + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=mask_m[:, None], other=0.0)
        w = _dequant_tile(w_ptr, offs_k[:, None], offs_n[None, :], row_bytes, mask_n[None, :], TYPE)
        if UPCAST_DOT:
            acc += tl.dot(x.to(tl.float32), w, input_precision="ieee")
        else:
            acc += tl.dot(x, w.to(x.dtype), input_precision=DOT_PRECISION)
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _gguf_dequant_kernel(
    w_ptr, out_ptr, N, K, row_bytes, TYPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr
):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (offs_n[:, None] < N) & (offs_k[None, :] < K)
    w = _dequant_tile(w_ptr, offs_k[None, :], offs_n[:, None], row_bytes, mask, TYPE)
    tl.store(out_ptr + offs_n[:, None] * K + offs_k[None, :], w.to(out_ptr.dtype.element_ty), mask=mask)


def _check(raw: torch.Tensor, ggml_type: GGMLType) -> tuple[int, int]:
    if ggml_type.name not in _CODES:
        raise ValueError(f"no Triton kernel for GGUF type {ggml_type.name}")
    if raw.dtype != torch.uint8 or raw.dim() != 2 or not raw.is_contiguous():
        raise ValueError("GGUF weights must be contiguous uint8 [N, row_bytes]")
    num_out, row_bytes = raw.shape
    return num_out, row_bytes // ggml_type.block_bytes * ggml_type.block_elems


def gguf_matmul(x: torch.Tensor, raw: torch.Tensor, ggml_type: GGMLType) -> torch.Tensor:
    """``x [M, K] @ W.T`` with ``W`` given as raw ggml rows ``[N, row_bytes]``."""
    num_out, num_in = _check(raw, ggml_type)
    num_tokens = x.shape[0]
    x = x.contiguous()
    out = torch.empty(num_tokens, num_out, dtype=x.dtype, device=x.device)
    block_m = 16 if num_tokens <= 16 else 32
    block_n, block_k = 32, 32
    grid = (triton.cdiv(num_tokens, block_m), triton.cdiv(num_out, block_n))
    _gguf_matmul_kernel[grid](
        x, raw, out, num_tokens, num_out, num_in, raw.shape[1], x.stride(0), out.stride(0),
        TYPE=_CODES[ggml_type.name], BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", UPCAST_DOT=upcast_dot(x.dtype),
    )
    return out


def gguf_dequantize(raw: torch.Tensor, ggml_type: GGMLType, dtype: torch.dtype) -> torch.Tensor:
    """Raw ggml rows ``[N, row_bytes]`` -> dense ``[N, K]`` in ``dtype``."""
    num_out, num_in = _check(raw, ggml_type)
    out = torch.empty(num_out, num_in, dtype=dtype, device=raw.device)
    block_n, block_k = 16, 256
    grid = (triton.cdiv(num_out, block_n), triton.cdiv(num_in, block_k))
    _gguf_dequant_kernel[grid](raw, out, num_out, num_in, raw.shape[1], TYPE=_CODES[ggml_type.name],
                               BLOCK_N=block_n, BLOCK_K=block_k)
    return out


# Batches up to this many tokens use the fused dequant-matmul kernel; larger
# ones dequantize the weight once and take the dense matmul.
FUSED_MAX_TOKENS = 32


def gguf_linear(x: torch.Tensor, raw: torch.Tensor, ggml_type: GGMLType) -> torch.Tensor:
    """The ``gguf_linear`` layer op on a GPU: ``x @ W.T`` for raw ggml rows ``[N, row_bytes]``."""
    if ggml_type.name not in _CODES:  # plain F32/F16/BF16 rows: nothing to dequantize in a kernel
        return F.linear(x, dequantize_gguf(raw, ggml_type, x.dtype))
    x2 = x.reshape(-1, x.shape[-1])
    if x2.shape[0] <= FUSED_MAX_TOKENS:
        out = gguf_matmul(x2, raw, ggml_type)
    else:
        out = F.linear(x2, gguf_dequantize(raw, ggml_type, x.dtype))
    return out.reshape(*x.shape[:-1], -1)
