"""Block-scaled fp8 linear layers in Triton (DeepSeek-V3 / Qwen3-FP8 checkpoints).

The weight ``qweight`` float8_e4m3fn ``[N, K]`` has one float32 scale per
``block_n x block_k`` block (``weight_scale [ceil(N / block_n), ceil(K /
block_k)]``, the checkpoints' ``weight_scale_inv``): ``W[n, k] = q[n, k] *
s[n // block_n, k // block_k]``. Two kernels serve the ``fp8_block_linear``
op:

* a few tokens (decode): ``_block_gemv_kernel``, weight-only: each program
  streams ``BLOCK_N`` weight rows (within one row of weight blocks) in
  ``[BLOCK_N, block_k]`` steps (``STEPS`` of them per loop iteration, so
  that enough loads are in flight), widens them in registers and multiplies
  them by the token rows scaled by the step's block scale, summing along K
  once at the end;
* more tokens: activations quantized per token and per ``block_k`` group
  (``fp8_triton.quantize_fp8_rows``), then ``_block_scaled_mm_kernel``: fp8
  tensor-core products of ``block_k``-deep tiles, each scaled by its
  activation-group and weight-block scales and summed in float32.

Tile shapes are parameters (``BlockGemvConfig``, ``BlockMmConfig``) with
defaults from the usual Hopper choices; ``benchmarks/quant_sweep_gpu.py``
sweeps them. Both are tested against the op's reference through the
interpreter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from octavo.kernels.quant.fp8_triton import quantize_fp8_rows
from octavo.kernels.tile_order import program_tile
from octavo.kernels.triton_utils import interpreting, next_power_of_2


@dataclass(frozen=True)
class BlockGemvConfig:
    block_n: int = 4
    steps: int = 8  # block_k-deep steps per loop iteration
    num_warps: int = 4


@dataclass(frozen=True)
class BlockMmConfig:
    block_m: int = 64
    block_n: int = 128
    group_m: int = 8  # programs along M that share weight tiles in the L2
    num_warps: int = 4
    num_stages: int = 3


DEFAULT_GEMV = BlockGemvConfig()
DEFAULT_MM = BlockMmConfig()
# Token counts up to this take the GEMV (the sweep's crossover).
GEMV_MAX_TOKENS = 4


@triton.jit(do_not_specialize=["M"])
def _block_gemv_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_sn, stride_om,
    GROUP_N: tl.constexpr, GROUP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    STEPS: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
):
    """``BLOCK_N`` divides ``GROUP_N`` (the launcher sees to it), so the
    program's rows share one row of weight-block scales and each step's
    scale is one scalar, applied to the activations. Activations are read
    per weight row (from L1) in the product's shape ``[BLOCK_M, BLOCK_N,
    GROUP_K]``, so both loads take one layout, and products are summed
    along K once at the end: nothing changes layout through shared memory
    in the loop (48 barriers a step in the sm_90 SASS of the form that
    reduced and scaled per step; tests/kernels/sass_loops.py)."""
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    mask_n = offs_n < N
    mask_m = offs_m < M
    rows = tl.where(mask_n, offs_n, 0)
    ks = tl.arange(0, GROUP_K)[None, None, :]
    w_rows = w_ptr + rows[None, :, None].to(tl.int64) * stride_wn
    x_rows = x_ptr + offs_m[:, None, None] * stride_xm + tl.zeros((1, BLOCK_N, 1), dtype=tl.int32)
    s_row = s_ptr + (pid * BLOCK_N // GROUP_N) * stride_sn
    rows_ok = mask_m[:, None, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N, GROUP_K), dtype=tl.float32)
    for k0 in range(0, K, GROUP_K * STEPS):
        for step in tl.static_range(STEPS):
            start = k0 + step * GROUP_K
            k_ok = (start + ks < K) | EVEN_K  # EVEN_K: no mask, so that the loads are vectors
            w = tl.load(w_rows + start + ks, mask=k_ok, other=0.0).to(tl.float32)
            x = tl.load(x_rows + start + ks, mask=rows_ok & k_ok, other=0.0).to(tl.float32)
            # Steps past K add zeros; their scale index is clamped to stay in bounds.
            scale = tl.load(s_row + tl.minimum(start, K - 1) // GROUP_K)
            acc += (x * scale) * w
    out = tl.sum(acc, axis=2)
    if HAS_BIAS:
        out += tl.load(b_ptr + rows).to(tl.float32)[None, :]
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit(do_not_specialize=["M"])
def _block_scaled_mm_kernel(
    a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, b_ptr, out_ptr, M, N, K,
    stride_am, stride_asm, stride_wn, stride_wsn, stride_om,
    GROUP_N: tl.constexpr, GROUP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    GROUP_M: tl.constexpr, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr,
):
    offs_m, offs_n, mask_m, mask_n, rows_m, rows_n = program_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, GROUP_K)):
        offs_k = kb * GROUP_K + tl.arange(0, GROUP_K)
        mask_k = offs_k < K
        a = tl.load(a_ptr + rows_m[:, None] * stride_am + offs_k[None, :], mask=mask_k[None, :], other=0.0)
        w = tl.load(w_ptr + rows_n[:, None] * stride_wn + offs_k[None, :], mask=mask_k[None, :], other=0.0)
        a_scale = tl.load(a_scale_ptr + rows_m * stride_asm + kb)
        w_scale = tl.load(w_scale_ptr + (rows_n // GROUP_N) * stride_wsn + kb)
        if UPCAST:  # the interpreter has no fp8 products
            product = tl.dot(a.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
        else:
            product = tl.dot(a, tl.trans(w))
        acc += product * a_scale[:, None] * w_scale[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + rows_n).to(tl.float32)[None, :]
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def _check(x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor, block_n: int, block_k: int) -> None:
    num_out, num_in = qweight.shape
    if x.shape[-1] != num_in:
        raise ValueError(f"x has {x.shape[-1]} features, the weight {num_in}")
    expected = (triton.cdiv(num_out, block_n), triton.cdiv(num_in, block_k))
    if tuple(weight_scale.shape) != expected or weight_scale.stride(1) != 1:
        raise ValueError(f"weight_scale of shape {tuple(weight_scale.shape)}; expected contiguous {expected}")
    if block_k != next_power_of_2(block_k) or block_k < 16:
        raise ValueError(f"block_k {block_k} must be a power of two of at least 16")


def block_gemv(
    x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor, block_n: int, block_k: int,
    bias: torch.Tensor | None, config: BlockGemvConfig = DEFAULT_GEMV,
) -> torch.Tensor:
    num_tokens = x.shape[0]
    out = torch.empty(num_tokens, qweight.shape[0], dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    # A program's rows within one row of weight blocks: one scale a step.
    rows_per_program = math.gcd(config.block_n, block_n)
    num_in = qweight.shape[1]
    grid = (triton.cdiv(qweight.shape[0], rows_per_program),)
    _block_gemv_kernel[grid](
        x, qweight, weight_scale, bias if bias is not None else x, out, num_tokens, qweight.shape[0], num_in,
        x.stride(0), qweight.stride(0), weight_scale.stride(0), out.stride(0),
        GROUP_N=block_n, GROUP_K=block_k, BLOCK_M=next_power_of_2(num_tokens), BLOCK_N=rows_per_program,
        STEPS=config.steps, HAS_BIAS=bias is not None, EVEN_K=num_in % (block_k * config.steps) == 0,
        num_warps=config.num_warps,
    )
    return out


def block_scaled_mm(
    x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor, block_n: int, block_k: int,
    bias: torch.Tensor | None, config: BlockMmConfig = DEFAULT_MM,
) -> torch.Tensor:
    num_tokens = x.shape[0]
    num_out, num_in = qweight.shape
    out = torch.empty(num_tokens, num_out, dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    xq, x_scale = quantize_fp8_rows(x, group_size=block_k) if num_in % block_k == 0 else _quantize_ragged(x, block_k)
    grid = (triton.cdiv(num_tokens, config.block_m) * triton.cdiv(num_out, config.block_n),)
    _block_scaled_mm_kernel[grid](
        xq, x_scale, qweight, weight_scale, bias if bias is not None else x, out, num_tokens, num_out, num_in,
        xq.stride(0), x_scale.stride(0), qweight.stride(0), weight_scale.stride(0), out.stride(0),
        GROUP_N=block_n, GROUP_K=block_k, BLOCK_M=config.block_m, BLOCK_N=config.block_n, GROUP_M=config.group_m,
        HAS_BIAS=bias is not None, UPCAST=interpreting(),
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out


def _quantize_ragged(x: torch.Tensor, block_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group quantization when the last group is partial: zero-pad K to whole groups."""
    pad = -x.shape[1] % block_k
    return quantize_fp8_rows(torch.nn.functional.pad(x, (0, pad)), group_size=block_k)


def fp8_block_linear(
    x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor, block_n: int, block_k: int,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """The ``fp8_block_linear`` layer op on the GPU."""
    _check(x, qweight, weight_scale, block_n, block_k)
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    if x2.shape[0] <= GEMV_MAX_TOKENS:
        out = block_gemv(x2, qweight, weight_scale, block_n, block_k, bias)
    else:
        out = block_scaled_mm(x2, qweight, weight_scale, block_n, block_k, bias)
    return out.reshape(*x.shape[:-1], -1)
