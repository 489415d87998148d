"""Skinny batches (1-16 tokens) of an 8-bit per-channel linear layer on the
tensor cores, in Triton: ``x @ (W * scale).T (+ b)``.

The weight-only GEMV (``gemv.py``) widens every 8-bit weight value to
float32 and multiplies it on the CUDA cores, a few instructions a byte: on
the H200 it streams one 8B decoder layer's fp8 weights at 2.3 TB/s of 4.2
(round 30), where the bfloat16 GEMV, with half the instructions a byte,
comes near the copy rate. Here each program owns ``BLOCK_N`` weight rows
and a run of K steps (split-K, so that a 4,096-row layer still fills the
SMs), and a K step is one ``tl.dot`` of the weight tile ``[BLOCK_N,
BLOCK_K]`` with the activations' ``[BLOCK_K, BLOCK_M]`` (swap-AB: the
weight rows take the MMA's 64-row side, the few tokens its narrow side).
Both loads are plain tiles that Triton software-pipelines (async copies,
``num_stages`` deep), so many bytes are in flight per SM and no value is
touched by a CUDA-core instruction on the W8A8 form:

* W8A8 (``x`` already fp8, with its per-token scales): an fp8 x fp8 dot,
  both scales applied to the float32 result;
* weight-only (``x`` in 16 bits): the weight tile is widened to ``x``'s
  dtype in registers, then the dot (an fp8 or int8 weight is exact in
  bfloat16; the products and sums are float32).

Split-K partials go to a float32 ``[SPLIT_K, M, N]`` buffer that
``int4_mm_triton``'s split-sum kernel adds up (with the bias). Tested
against the float32 reference through the interpreter.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from octavo.errors import InvalidArgumentError
from octavo.kernels.pdl import pdl_enabled, pdl_release, pdl_wait
from octavo.kernels.quant import scaled_mm
from octavo.kernels.quant.int4_mm_triton import fit_block_k, split_k_for, sum_splits
from octavo.kernels.triton_utils import dot_dtype, dot_precision, ints_from_env

# The MMA's narrow side: every batch up to this many tokens is one row tile.
BLOCK_M = 16
MAX_TOKENS = BLOCK_M


@dataclass(frozen=True)
class SkinnyConfig:
    block_n: int = 64
    block_k: int = 256
    split_k: int = 0  # 0: as many splits as fill the SMs twice over (``split_k_for``)
    num_warps: int = 4
    num_stages: int = 4


# Not swept yet (benchmarks/quant_sweep_gpu.py, family fp8, paths skinny / skinny_w8a8).
DEFAULT_CONFIG = SkinnyConfig()
W8A8_MAX_TOKENS_ENV = "OCTAVO_FP8_SKINNY_MAX_TOKENS"


def w8a8_max_tokens() -> int:
    """fp8 W8A8 matmuls of at most this many tokens run here instead of
    ``torch._scaled_mm`` (``OCTAVO_FP8_SKINNY_MAX_TOKENS``, 0 to 16; default
    0 until a GPU run measures the crossover). With the weight-only GEMV off
    (``OCTAVO_QUANT_GEMV_MAX_TOKENS=0``) decode then takes W8A8 too, its
    activations quantized by the fused norm / SiLU-and-mul ops."""
    value = os.environ.get(W8A8_MAX_TOKENS_ENV, "0")
    if not value.isdigit() or int(value) > MAX_TOKENS:
        raise InvalidArgumentError(f"{W8A8_MAX_TOKENS_ENV}={value!r}: expected a number of tokens from 0 (off) to {MAX_TOKENS}")
    return int(value)


def w8a8_matmul(xq, x_scale, qweight, weight_scale, bias, num_tokens: int, dtype: torch.dtype) -> torch.Tensor:
    """``scaled_mm.fp8_scaled_mm``'s contract (``xq`` fp8 ``[M', K]`` with
    ``M' >= num_tokens`` rows, ``x_scale [M', 1]``), on this kernel for
    batches up to ``w8a8_max_tokens()``, else on ``torch._scaled_mm``."""
    if 0 < num_tokens <= w8a8_max_tokens() and accepts(xq[:num_tokens], qweight):
        return skinny_8bit_linear(xq[:num_tokens], qweight, weight_scale, bias,
                                  x_scale[:num_tokens].reshape(-1), dtype)
    return scaled_mm.fp8_scaled_mm(xq, x_scale, qweight, weight_scale, bias, num_tokens, dtype)


@functools.cache
def config_from_env() -> SkinnyConfig | None:
    """``OCTAVO_SKINNY_8BIT_TILES=block_n,block_k,split_k,num_warps,num_stages`` (tuning runs), else None."""
    parts = ints_from_env("OCTAVO_SKINNY_8BIT_TILES", "block_n,block_k,split_k,num_warps,num_stages", (5,))
    return SkinnyConfig(*parts) if parts is not None else None


@triton.jit
def _skinny_kernel(
    x_ptr, xs_ptr, w_ptr, ws_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om, stride_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    X_SCALED: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr,
):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    # Rows past N or M read row 0 (no mask in the loop); their results are not stored.
    rows = tl.where(offs_n < N, offs_n, 0).to(tl.int64)
    tokens = tl.where(offs_m < M, offs_m, 0)
    num_steps = K // BLOCK_K
    per_split = tl.cdiv(num_steps, SPLIT_K)
    first_step = tl.program_id(1) * per_split
    last_step = tl.minimum(first_step + per_split, num_steps)
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + rows[:, None] * stride_wn + offs_k[None, :]
    x_ptrs = x_ptr + tokens[:, None] * stride_xm + offs_k[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    pdl_wait(PDL)  # the activations come from the kernel before (octavo/kernels/pdl.py)
    for step in range(first_step, last_step):
        w = tl.load(w_ptrs + step * BLOCK_K)
        x = tl.load(x_ptrs + step * BLOCK_K)
        if not X_SCALED:  # widened for the dot (float32 in the interpreter)
            w = w.to(DOT_DTYPE)
            x = x.to(DOT_DTYPE)
        acc = tl.dot(w, tl.trans(x), acc, input_precision=PRECISION)
    pdl_release(PDL)
    acc *= tl.load(ws_ptr + rows).to(tl.float32)[:, None]
    if X_SCALED:
        acc *= tl.load(xs_ptr + tokens).to(tl.float32)[None, :]
    mask = (offs_n < N)[:, None] & (offs_m < M)[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptr + offs_m[None, :] * stride_om + offs_n[:, None], acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:  # float32 partials [SPLIT_K, M, N], summed by sum_splits
        partial = out_ptr + tl.program_id(1) * stride_split + offs_m[None, :] * N + offs_n[:, None]
        tl.store(partial, acc, mask=mask)


def accepts(x: torch.Tensor, qweight: torch.Tensor) -> bool:
    """Whether the kernel takes these shapes: at most ``MAX_TOKENS`` rows, inputs a multiple of 16."""
    return x.shape[0] <= MAX_TOKENS and qweight.shape[1] % 16 == 0


def skinny_8bit_linear(
    x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None,
    x_scale: torch.Tensor | None = None, out_dtype: torch.dtype | None = None, config: SkinnyConfig | None = None,
) -> torch.Tensor:
    """``x [M, K] @ (qweight [N, K] * weight_scale [N]).T (+ bias)`` for ``M <= MAX_TOKENS``.

    ``x_scale`` (float32 ``[M]``) marks ``x`` as fp8 codes (W8A8); without it
    ``x`` is a 16-bit activation and the weight is widened to its dtype."""
    num_tokens, num_in = x.shape
    num_out = qweight.shape[0]
    if not accepts(x, qweight):
        raise ValueError(f"skinny_8bit_linear takes <= {MAX_TOKENS} rows and inputs a multiple of 16, "
                         f"got x {tuple(x.shape)} and a weight {tuple(qweight.shape)}")
    out = torch.empty(num_tokens, num_out, dtype=out_dtype or x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    config = config or config_from_env() or DEFAULT_CONFIG
    block_k = fit_block_k(config.block_k, num_in, 16)
    split = config.split_k or split_k_for(triton.cdiv(num_out, config.block_n), num_in // block_k, x.device)
    target = out if split == 1 else torch.empty(split, num_tokens, num_out, dtype=torch.float32, device=x.device)
    pdl = pdl_enabled(x.device, num_tokens)
    _skinny_kernel[(triton.cdiv(num_out, config.block_n), split)](
        x, x_scale if x_scale is not None else weight_scale, qweight, weight_scale, target,
        num_tokens, num_out, num_in, x.stride(0), qweight.stride(0), out.stride(0),
        target.stride(0) if split > 1 else 0,
        BLOCK_M=BLOCK_M, BLOCK_N=config.block_n, BLOCK_K=block_k, SPLIT_K=split, X_SCALED=x_scale is not None,
        DOT_DTYPE=dot_dtype(x.dtype) if x_scale is None else None, PRECISION=dot_precision(x.dtype), PDL=pdl, num_warps=config.num_warps, num_stages=config.num_stages, launch_pdl=pdl,
    )
    if split > 1:
        sum_splits(target, bias, out)
    elif bias is not None:
        out += bias
    return out
