"""Weight-only int4 dequant-GEMM in Triton (Octavo's int4 layout, see ``int4``).

Each program computes a ``[BLOCK_M, BLOCK_N]`` tile of ``x @ W.T``: it walks
its share of the K dimension in ``BLOCK_K`` steps, unpacks the nibbles of
``qweight`` for the tile, applies the group's zero point and scale in
float32, and multiplies in the activation dtype with float32 accumulation.
``BLOCK_K`` divides ``group_size``, so one step reads one row of scales.
Small batches (decode) split K over several programs that add into a
float32 buffer, so that the GPU has enough programs to hide memory latency.

Tested against ``int4.dequantize_int4`` + matmul through the interpreter.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


def upcast_dot(dtype: torch.dtype) -> bool:
    """Triton's interpreter multiplies bfloat16 tiles wrongly (3.9); under
    the interpreter such dots run in float32 instead (same result up to
    rounding). Compiled kernels are unaffected."""
    return dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"


# M (tokens in the step) changes every step: not specialised on.
@triton.jit(do_not_specialize=["M"])
def _int4_matmul_kernel(
    x_ptr, qweight_ptr, scales_ptr, zeros_ptr, out_ptr,
    M, N, K, group_size,
    stride_xm, stride_xk, stride_qk, stride_qn, stride_sg, stride_zg, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    num_k_tiles = K // BLOCK_K
    tiles_per_split = (num_k_tiles + SPLIT_K - 1) // SPLIT_K
    first_tile = pid_k * tiles_per_split
    last_tile = tl.minimum(first_tile + tiles_per_split, num_k_tiles)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for tile in range(first_tile, last_tile):
        offs_k = tile * BLOCK_K + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk, mask=mask_m[:, None], other=0.0)
        packed = tl.load(
            qweight_ptr + (offs_k[:, None] // 8) * stride_qk + offs_n[None, :] * stride_qn,
            mask=mask_n[None, :],
            other=0,
        )
        values = (packed >> ((offs_k[:, None] % 8) * 4)) & 0xF
        group = (tile * BLOCK_K) // group_size
        scale = tl.load(scales_ptr + group * stride_sg + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        zero = tl.load(zeros_ptr + group * stride_zg + offs_n, mask=mask_n, other=0).to(tl.float32)
        weight = ((values.to(tl.float32) - zero[None, :]) * scale[None, :]).to(x.dtype)
        if UPCAST_DOT:
            acc += tl.dot(x.to(tl.float32), weight.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(x, weight, input_precision=DOT_PRECISION)
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(out_ptrs, acc, mask=mask)


def _config(num_tokens: int, out_features: int, in_features: int, group_size: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K) for a problem size."""
    block_k = min(group_size, 64)
    if num_tokens <= 16:
        block_m, block_n = 16, 64
    elif num_tokens <= 64:
        block_m, block_n = 32, 64
    else:
        block_m, block_n = 64, 128
    num_tiles = triton.cdiv(num_tokens, block_m) * triton.cdiv(out_features, block_n)
    num_k_tiles = in_features // block_k
    split_k = 1
    # Aim for a few hundred programs on small batches, each with >= 4 K tiles.
    while num_tokens <= 64 and num_tiles * split_k < 256 and num_k_tiles // (split_k * 2) >= 4:
        split_k *= 2
    return block_m, block_n, block_k, split_k


def int4_matmul(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int
) -> torch.Tensor:
    """``x [M, K] @ W.T -> [M, N]`` in ``x``'s dtype."""
    num_tokens, in_features = x.shape
    out_features = qweight.shape[1]
    if in_features != qweight.shape[0] * 8 or in_features % group_size:
        raise ValueError(f"int4_matmul: x has {in_features} features, qweight packs {qweight.shape[0] * 8}")
    block_m, block_n, block_k, split_k = _config(num_tokens, out_features, in_features, group_size)
    if split_k == 1:
        out = torch.empty(num_tokens, out_features, dtype=x.dtype, device=x.device)
    else:
        out = torch.zeros(num_tokens, out_features, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(num_tokens, block_m), triton.cdiv(out_features, block_n), split_k)
    _int4_matmul_kernel[grid](
        x, qweight, scales, zeros, out,
        num_tokens, out_features, in_features, group_size,
        x.stride(0), x.stride(1), qweight.stride(0), qweight.stride(1), scales.stride(0), zeros.stride(0),
        out.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        UPCAST_DOT=upcast_dot(x.dtype),
    )
    return out if split_k == 1 else out.to(x.dtype)


def int4_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """The ``int4_linear`` layer op: ``x @ W.T + bias`` on a GPU."""
    out = int4_matmul(x.reshape(-1, x.shape[-1]), qweight, scales, zeros, group_size)
    out = out.reshape(*x.shape[:-1], out.shape[-1])
    return out if bias is None else out + bias
