"""The residual add and RMSNorm inside the GEMV that follows them (decode).

At batch 1 a decoder layer's norm is a launch of its own: one program
reads the hidden row and the residual, writes their sum and the normed row,
and the projection after it waits for that launch to finish before it
reads the normed row (1.9 us of kernel time each, 97 a Qwen3-30B-A3B step;
``benchmarks/RESULTS.md`` round 37). Here every program of the projection
forms the sum itself (the row is a few KB, read from L2 by each program),
its first weight tile already streaming (loaded before the wait for the
kernel before), and program 0 also writes the sum and the normed row for
whoever reads them next (the residual stream; a MoE layer's experts).

Each step multiplies ``sum * norm_weight`` by the weights and accumulates
the sum's squares; the RMS scales the reduced products at the end, so the
row is read once. The normed row is then not rounded to the dtype before
the products, as the composition rounds it: the outputs differ from it
within the GEMM's bounds (they agree in float32). The normed row program 0
writes afterwards is the reference's. (A form that found the RMS in a
first pass and rounded as the reference does was slower still: 3.33 ms
against 3.25 a Qwen3-30B-A3B token on an H100.)

``route`` (``fused_add_rms_norm_route``, a MoE layer's router): the
projection is the router's logits, and the last program to finish (an
atomic count; it resets the count for the next launch) reads every
program's logits back and picks each token's experts with
``moe_topk.route_token``, the top-k launch's own code: one launch for the
norm, the router and the top-k.

The ``fused_add_rms_norm_linear`` and ``fused_add_rms_norm_route`` layer
ops on CUDA for at most ``gemv.MAX_ROWS`` tokens, registered only with
``OCTAVO_NORM_GEMV=1`` (``builtin.norm_gemv_enabled``): on an H100 (round
38 of ``benchmarks/RESULTS.md``) the fused kernels took as long as the norm, GEMV and top-k launches they
replace (853 against 841 us of kernels a Qwen3-30B-A3B step) and decode was
no faster (3.25 against 3.22 ms a token; Llama-3.1-8B 5.41 against 5.37):
with PDL those launches already overlapped, and the work they did moved
into the projections' programs.
References in ``octavo.ops.reference``; tested against them through the
interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo.kernels.gemv import DEFAULT_CONFIG, GemvConfig, config_from_env, fit_to_rows
from octavo.kernels.moe_topk import experts_pad, route_token
from octavo.kernels.pdl import pdl_enabled, pdl_release, pdl_wait


@triton.jit
def _summed_tile(x_rows, r_rows, mask_m, k0, K, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """``x + residual`` rounded to the dtype, ``[BLOCK_M, 1, BLOCK_K]``, and its column offsets and mask."""
    offs_k = (k0 + tl.arange(0, BLOCK_K))[None, None, :]
    mask = mask_m[:, None, None] if EVEN_K else mask_m[:, None, None] & (offs_k < K)
    x = tl.load(x_rows + offs_k, mask=mask, other=0.0)
    r = tl.load(r_rows + offs_k, mask=mask, other=0.0)
    return (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype), offs_k, mask


@triton.jit
def _weight_tile(w_rows, k0, K, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """One K step's weight rows ``[1, BLOCK_N, BLOCK_K]``."""
    offs_k = (k0 + tl.arange(0, BLOCK_K))[None, None, :]
    if EVEN_K:
        return tl.load(w_rows + offs_k)
    return tl.load(w_rows + offs_k, mask=offs_k < K, other=0.0)


@triton.jit
def _norm_tile(g_ptr, x_rows, r_rows, mask_m, k0, K, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """One K step's sum (dtype), the norm's weight (float32), offsets and mask."""
    summed, offs_k, mask = _summed_tile(x_rows, r_rows, mask_m, k0, K, BLOCK_K, EVEN_K)
    if EVEN_K:
        g = tl.load(g_ptr + offs_k)
    else:
        g = tl.load(g_ptr + offs_k, mask=offs_k < K, other=0.0)
    return summed, g.to(tl.float32), offs_k, mask


@triton.jit
def _normed(summed, g32, inv_rms):
    """The reference's rounding: normalise in float32, round, scale, round."""
    dtype = summed.dtype
    return (g32 * (summed.to(tl.float32) * inv_rms).to(dtype).to(tl.float32)).to(dtype)


@triton.jit
def _write_rows(x_rows, r_rows, g_ptr, normed_ptr, sum_ptr, inv_rms, offs_m, mask_m, K,
                BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """The sum and the normed row, stored (program 0's epilogue in one pass)."""
    for k0 in range(0, K, BLOCK_K):
        summed, g32, offs_k, mask = _norm_tile(g_ptr, x_rows, r_rows, mask_m, k0, K, BLOCK_K, EVEN_K)
        row_offsets = offs_m[:, None, None] * K + offs_k
        tl.store(sum_ptr + row_offsets, summed, mask=mask)
        tl.store(normed_ptr + row_offsets, _normed(summed, g32, inv_rms), mask=mask)


@triton.jit
def _products(acc, squares, w, x_rows, r_rows, g_ptr, mask_m, k0, K, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """One K step: ``acc += sum * g * w`` and the sum's squares (the RMS
    scales the reduced products at the end)."""
    summed, g32, _, _ = _norm_tile(g_ptr, x_rows, r_rows, mask_m, k0, K, BLOCK_K, EVEN_K)
    s32 = summed.to(tl.float32)
    squares += tl.sum(s32 * s32, axis=2, keep_dims=True)
    return acc + (s32 * g32) * w.to(tl.float32), squares


@triton.jit
def _norm_gemv_kernel(
    x_ptr, r_ptr, g_ptr, w_ptr, b_ptr, out_ptr, normed_ptr, sum_ptr,
    weights_ptr, ids_ptr, counter_ptr, eps,
    M, N, K, stride_xm, stride_rm, stride_wn, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr, TOP_K: tl.constexpr, K_PAD: tl.constexpr, E_PAD: tl.constexpr,
    RENORMALIZE: tl.constexpr, PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    mask_n, mask_m = offs_n < N, offs_m < M
    rows = tl.where(mask_n, offs_n, 0)  # out-of-range feature rows read row 0
    w_rows = (w_ptr + rows[:, None] * stride_wn)[None, :, :]
    x_rows = x_ptr + offs_m[:, None, None] * stride_xm
    r_rows = r_ptr + offs_m[:, None, None] * stride_rm
    # The first weight tile goes before the wait for the kernel before (no
    # kernel writes weights): it streams in while the norm is formed.
    w = _weight_tile(w_rows, 0, K, BLOCK_K, EVEN_K)
    pdl_wait(PDL)
    squares = tl.zeros((BLOCK_M, 1, 1), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(BLOCK_K, K, BLOCK_K):  # the next tile's loads before this one's products
        w_next = _weight_tile(w_rows, k0, K, BLOCK_K, EVEN_K)
        acc, squares = _products(acc, squares, w, x_rows, r_rows, g_ptr, mask_m, k0 - BLOCK_K, K, BLOCK_K, EVEN_K)
        w = w_next
    acc, squares = _products(acc, squares, w, x_rows, r_rows, g_ptr, mask_m, (K - 1) // BLOCK_K * BLOCK_K, K,
                             BLOCK_K, EVEN_K)
    pdl_release(PDL)
    inv_rms = tl.rsqrt(squares / K + eps)
    out = tl.sum(acc, axis=2) * tl.sum(inv_rms, axis=2)
    if pid == 0:
        _write_rows(x_rows, r_rows, g_ptr, normed_ptr, sum_ptr, inv_rms, offs_m, mask_m, K, BLOCK_K, EVEN_K)
    if HAS_BIAS:
        out += tl.load(b_ptr + rows).to(tl.float32)[None, :]
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])
    if TOP_K > 0:
        # The last program to get here routes: every other program's logits
        # are stored before its count (release), and read after this one's (acquire).
        arrived = tl.atomic_add(counter_ptr, 1, sem="acq_rel")
        if arrived == tl.num_programs(0) - 1:
            choice = tl.arange(0, K_PAD)
            for m in range(0, M):
                ids, weights = route_token(out_ptr + m * stride_om, N, E_PAD, TOP_K, K_PAD, RENORMALIZE)
                tl.store(ids_ptr + m * TOP_K + choice, ids, mask=choice < TOP_K)
                tl.store(weights_ptr + m * TOP_K + choice, weights, mask=choice < TOP_K)
            tl.atomic_xchg(counter_ptr, 0)


# One arrival count per device for the routing form: the last program resets
# it, so every launch (and every CUDA-graph replay) finds it at zero.
_COUNTERS: dict[torch.device, torch.Tensor] = {}


def _counter(device: torch.device) -> torch.Tensor:
    counter = _COUNTERS.get(device)
    if counter is None:
        counter = _COUNTERS[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return counter


def _config(num_tokens: int) -> GemvConfig:
    return fit_to_rows(config_from_env("OCTAVO_GEMV") or DEFAULT_CONFIG, num_tokens)


def _launch(x, residual, norm_weight, eps, weight, bias, out, route=None):
    """Run the kernel; ``route``: ``(weights, ids, top_k, renormalize)`` for the routing form."""
    num_tokens, hidden = x.shape
    normed, summed = torch.empty_like(x), torch.empty_like(x)
    config = _config(num_tokens)
    block_k = min(config.block_k, triton.next_power_of_2(hidden))
    top_k = route[2] if route else 0
    pdl = pdl_enabled(x.device, num_tokens)
    _norm_gemv_kernel[(triton.cdiv(weight.shape[0], config.block_n),)](
        x, residual, norm_weight, weight, bias if bias is not None else weight, out, normed, summed,
        route[0] if route else out, route[1] if route else out, _counter(x.device) if route else out, eps,
        num_tokens, weight.shape[0], hidden, x.stride(0), residual.stride(0), weight.stride(0), out.stride(0),
        BLOCK_M=triton.next_power_of_2(num_tokens), BLOCK_N=config.block_n, BLOCK_K=block_k,
        HAS_BIAS=bias is not None, EVEN_K=hidden % block_k == 0, TOP_K=top_k,
        K_PAD=triton.next_power_of_2(max(top_k, 1)), E_PAD=experts_pad(weight.shape[0]),
        RENORMALIZE=bool(route and route[3]), PDL=pdl,
        num_warps=config.num_warps, num_stages=config.num_stages, launch_pdl=pdl,
    )
    return normed, summed


def fused_add_rms_norm_linear(x, residual, norm_weight, eps, weight, bias):
    """The ``fused_add_rms_norm_linear`` layer op for a few token rows:
    ``(linear(normed, weight, bias), normed, summed)`` in one launch."""
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    normed, summed = _launch(x, residual, norm_weight, eps, weight, bias, out)
    return out, normed, summed


def fused_add_rms_norm_route(x, residual, norm_weight, eps, router_weight, top_k, renormalize):
    """The ``fused_add_rms_norm_route`` layer op for a few token rows:
    ``(topk_weights, topk_ids, normed, summed)`` in one launch."""
    num_tokens = x.shape[0]
    logits = torch.empty(num_tokens, router_weight.shape[0], dtype=x.dtype, device=x.device)
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=x.device)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int32, device=x.device)
    normed, summed = _launch(x, residual, norm_weight, eps, router_weight, None, logits, (weights, ids, top_k, renormalize))
    return weights, ids, normed, summed
