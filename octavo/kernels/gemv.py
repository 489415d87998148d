"""Skinny linear layers (a few tokens, decode) in Triton: ``x @ W.T (+ b)``.

At batch 1 a decoder step is a chain of GEMVs that read every weight once,
so its speed is the bandwidth those GEMVs reach. Each program here owns
``BLOCK_N`` output features: it streams their weight rows in
``[BLOCK_N, BLOCK_K]`` tiles (contiguous along K, so loads are wide and
coalesced), multiplies them in float32 by the ``BLOCK_M`` token rows of
``x`` and reduces along K once at the end (``DEFER_REDUCE``) or at every
step. No split-K: small ``BLOCK_N`` already gives every SM several
programs at Llama shapes, and split-K would need a float32 buffer, atomics
and one more launch.

``weight_scale`` (float32 ``[N]``, or ``[2 * I]`` when gated) makes
it the weight-only GEMV of an 8-bit (fp8 or int8) per-channel weight: the
weight is read in its own dtype, widened in registers, and each output
feature is multiplied by its scale before the bias (the ``fp8_linear`` /
``int8_weight_only_linear`` ops at decode: half the bytes of bfloat16).

``gated="silu"`` (or ``silu_mul=True``) fuses the MLP's activation into
the gate-up projection: ``W`` is ``[gate; up]`` (``2 * I`` rows), each
program computes the same ``BLOCK_N`` features of both halves and writes
``silu(gate) * up``, which saves the ``[M, 2 * I]`` intermediate and one
launch per layer. ``gated="gelu_tanh"`` does the same for GeGLU (Gemma's
``gelu_pytorch_tanh``): the activation is a constexpr code of
``activation.act_then_mul``, so each form compiles to its own kernel.

Tested against ``F.linear`` (and the gated references) through the
interpreter; tiles come from an H200 sweep (``benchmarks/gemv_gpu_sweep.py``).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from octavo.kernels.activation import ACT_CODES, SILU, act_then_mul
from octavo.kernels.pdl import pdl_enabled, pdl_release, pdl_wait
from octavo.kernels.quant import fp8_gemv_rows
from octavo.kernels.triton_utils import ints_from_env, next_power_of_2

# The most token rows one launch takes (BLOCK_M covers them all).
MAX_ROWS = 8
# ``gated`` names -> the ACT codes of ``activation.act_then_mul``.
GATED_ACTIVATIONS = ACT_CODES


@dataclass(frozen=True)
class GemvConfig:
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    defer_reduce: bool = True
    # Issue the next K step's loads before this step's arithmetic (a manual
    # two-stage pipeline; candidates in the GPU sweeps).
    prefetch: bool = False
    # Without prefetch: the K loop as tl.range(num_stages=num_stages), which
    # Triton 3.5+ pipelines load by load through shared memory (cp.async)
    # without a dot; off, num_stages does not matter (no dot, no pipelining).
    pipelined: bool = False


# Best at 1 token on Llama-3.1-8B shapes on the H200 (benchmarks/gemv_gpu_sweep.py,
# round 16: 72 configs; a 4-layer chain 1.076x cuBLAS + silu_and_mul). The
# loads are not software-pipelined (no dot, not ``pipelined``), so num_stages
# does not matter; wide K tiles keep enough loads in flight per thread. The
# fused gate-up reads two weight rows per feature: one feature a program,
# reduced each step (every gated form: the activation is a few flops per
# feature, the weight stream is the same).
DEFAULT_CONFIG = GemvConfig(block_n=4, block_k=2048, num_warps=4, num_stages=2)
DEFAULT_SILU_CONFIG = GemvConfig(block_n=1, block_k=2048, num_warps=2, num_stages=2, defer_reduce=False)
# 8-bit weights (fp8 / int8 weight-only), swept on the H200 (round 26): an 8B
# decoder layer's four GEMVs 118.0 -> 113.4 us.
DEFAULT_8BIT_CONFIG = GemvConfig(block_n=8, block_k=1024, num_warps=4, num_stages=2)


@functools.cache
def config_from_env(name: str) -> GemvConfig | None:
    """``OCTAVO_GEMV`` / ``OCTAVO_GEMV_SILU`` (every gated form) / ``OCTAVO_GEMV_8BIT`` (8-bit weights) =
    ``block_n,block_k,num_warps,num_stages[,defer[,prefetch[,pipelined]]]`` (tuning runs)."""
    parts = ints_from_env(name, "block_n,block_k,num_warps,num_stages[,defer[,prefetch[,pipelined]]]", (4, 5, 6, 7))
    if parts is None:
        return None
    return GemvConfig(*parts[:4], defer_reduce=bool(parts[4]) if len(parts) > 4 else True,
                      prefetch=bool(parts[5]) if len(parts) > 5 else False,
                      pipelined=bool(parts[6]) if len(parts) > 6 else False)


# Products held per program when the reduction is deferred (the 1-token
# default's BLOCK_N x BLOCK_K): more token rows take narrower K tiles, so
# that registers do not spill.
DEFERRED_PRODUCTS = 8192


def default_config(gated: bool, num_tokens: int = 1) -> GemvConfig:
    if gated:
        tuned = config_from_env("OCTAVO_GEMV_SILU")
        return tuned or (DEFAULT_SILU_CONFIG if num_tokens <= 1 else gated_rows_config(num_tokens))
    return fit_to_rows(config_from_env("OCTAVO_GEMV") or DEFAULT_CONFIG, num_tokens)


def gated_rows_config(num_tokens: int) -> GemvConfig:
    """The gated GEMV's tiles for 2-8 token rows (not swept: the sweep is at
    one row, whose per-step reduction, 2 warps and 2,048 inputs a step, these
    rows used to take). One feature a program, its products deferred, 4
    warps along K: the sm_90 loop at 2 / 4 / 8 rows 488 / 851 / 1,602
    instructions with 4 barriers (and a spill at 2) -> 192 / 169 / 307 with
    none, 3.8 -> 3.0, 3.3 -> 2.6, 3.1 -> 2.4 instructions a product."""
    block_k = max(1024, 4096 // next_power_of_2(num_tokens))
    return GemvConfig(block_n=1, block_k=block_k, num_warps=4, num_stages=2, defer_reduce=True)


def fit_to_rows(config: GemvConfig, num_tokens: int) -> GemvConfig:
    """``config`` with fewer feature rows (then, if need be, a narrower K
    tile) so that a deferred reduction holds no more products for
    ``num_tokens`` rows than ``DEFERRED_PRODUCTS`` or the config's own
    one-row count (a tuned config runs as swept at one row). Feature rows go
    first: a K tile narrower than its warps' span puts warps along the
    feature rows, where the weights' and the activations' loads take
    different layouts and meet through shared memory every step (sm_90 SASS
    at 4 tokens: 8 barriers a step with (4, 512), none with (1, 2048))."""
    rows = next_power_of_2(num_tokens)
    limit = max(DEFERRED_PRODUCTS, config.block_n * config.block_k)
    if not config.defer_reduce or rows * config.block_n * config.block_k <= limit:
        return config
    block_n = next_power_of_2(max(1, limit // (rows * config.block_k)) + 1) // 2  # the power of 2 at or below
    block_k = config.block_k
    if rows * block_n * block_k > limit:
        block_k = max(128, limit // (rows * block_n))
    return dataclasses.replace(config, block_n=block_n, block_k=block_k)


@triton.jit
def _load_weights(w_rows, k0, K, up_offset, BLOCK_K: tl.constexpr, GATED: tl.constexpr, EVEN_K: tl.constexpr):
    """One K step's weight tile(s) ``[1, BLOCK_N, BLOCK_K]``."""
    offs_k = (k0 + tl.arange(0, BLOCK_K))[None, None, :]
    w_ptrs = w_rows[None, :, :] + offs_k
    if EVEN_K:
        w = tl.load(w_ptrs)
        w_up = tl.load(w_ptrs + up_offset) if GATED else w
    else:
        mask_k = offs_k < K
        w = tl.load(w_ptrs, mask=mask_k, other=0.0)
        w_up = tl.load(w_ptrs + up_offset, mask=mask_k, other=0.0) if GATED else w
    return w, w_up


@triton.jit
def _load_x(x_rows, mask_m, k0, K, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """One K step's activations ``[BLOCK_M, 1, BLOCK_K]`` (or ``[BLOCK_M, BLOCK_N, BLOCK_K]``)."""
    offs_k = (k0 + tl.arange(0, BLOCK_K))[None, None, :]
    if EVEN_K:
        return tl.load(x_rows + offs_k, mask=mask_m[:, None, None], other=0.0)
    return tl.load(x_rows + offs_k, mask=mask_m[:, None, None] & (offs_k < K), other=0.0)


@triton.jit
def _load_step(w_rows, x_rows, mask_m, k0, K, up_offset,
               BLOCK_K: tl.constexpr, GATED: tl.constexpr, EVEN_K: tl.constexpr):
    """One K step's weight tile(s) ``[1, BLOCK_N, BLOCK_K]`` and activations ``[BLOCK_M, 1, BLOCK_K]``.

    Both are loaded in the rank of their product (3-D), not expanded from
    2-D loads after the fact: the loads then get the product's own layout
    (vectors along K), and the weight tile does not make a round trip
    through shared memory to change layout (the sm_90 SASS of the 2-D form
    had it, with two barriers per tile; ``tests/kernels/sass_loops.py``)."""
    w, w_up = _load_weights(w_rows, k0, K, up_offset, BLOCK_K, GATED, EVEN_K)
    return w, _load_x(x_rows, mask_m, k0, K, BLOCK_K, EVEN_K), w_up


@triton.jit
def _accumulate(acc, acc_up, w, x, w_up, GATED: tl.constexpr, DEFER_REDUCE: tl.constexpr):
    """``acc (+)= x * w`` (and the up half's) in float32, reduced along K now or at the end."""
    x3 = x.to(tl.float32)
    prod = x3 * w.to(tl.float32)
    acc += prod if DEFER_REDUCE else tl.sum(prod, axis=2)
    if GATED:
        prod_up = x3 * w_up.to(tl.float32)
        acc_up += prod_up if DEFER_REDUCE else tl.sum(prod_up, axis=2)
    return acc, acc_up


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, b_ptr, scale_ptr, out_ptr,
    M, N, K, stride_xm, stride_wn, stride_om, up_offset,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr, GATED: tl.constexpr, ACT: tl.constexpr, DEFER_REDUCE: tl.constexpr,
    EVEN_K: tl.constexpr, HAS_SCALE: tl.constexpr, PREFETCH: tl.constexpr, PDL: tl.constexpr,
    STAGES: tl.constexpr = 1,
):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    mask_n = offs_n < N
    mask_m = offs_m < M
    # Out-of-range feature rows read row 0 instead of masking every load.
    rows = tl.where(mask_n, offs_n, 0)
    w_rows = w_ptr + rows[:, None] * stride_wn
    x_rows = x_ptr + offs_m[:, None, None] * stride_xm
    if w_ptr.dtype.element_ty.primitive_bitwidth < 16:
        # 8-bit weights load 16 values a vector, 16-bit activations 8: read
        # per weight row (from L1), the activations' loads then match the
        # weights' shape and take their layout, instead of changing layout
        # through shared memory every K step.
        x_rows += tl.zeros((1, BLOCK_N, 1), dtype=tl.int32)
    if DEFER_REDUCE:
        acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = acc
    if PREFETCH:
        # Loads are not software-pipelined without a dot (unless ``pipelined``
        # asks): issue step k+1's before multiplying step k's, so one step's
        # latency hides behind the other's arithmetic (the last step is the
        # epilogue). The first weight tile goes before the wait for the kernel
        # before (``pdl``): no kernel writes weights.
        w, w_up = _load_weights(w_rows, 0, K, up_offset, BLOCK_K, GATED, EVEN_K)
        pdl_wait(PDL)
        x = _load_x(x_rows, mask_m, 0, K, BLOCK_K, EVEN_K)
        for k0 in range(BLOCK_K, K, BLOCK_K):
            w_next, x_next, up_next = _load_step(
                w_rows, x_rows, mask_m, k0, K, up_offset, BLOCK_K, GATED, EVEN_K)
            acc, acc_up = _accumulate(acc, acc_up, w, x, w_up, GATED, DEFER_REDUCE)
            w, x, w_up = w_next, x_next, up_next
        acc, acc_up = _accumulate(acc, acc_up, w, x, w_up, GATED, DEFER_REDUCE)
    else:
        pdl_wait(PDL)
        for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
            w, x, w_up = _load_step(w_rows, x_rows, mask_m, k0, K, up_offset, BLOCK_K, GATED, EVEN_K)
            acc, acc_up = _accumulate(acc, acc_up, w, x, w_up, GATED, DEFER_REDUCE)
    pdl_release(PDL)
    out = tl.sum(acc, axis=2) if DEFER_REDUCE else acc
    out_up = tl.sum(acc_up, axis=2) if DEFER_REDUCE else acc_up
    _store_features(out, out_up, b_ptr, scale_ptr, out_ptr, rows, offs_m, offs_n, mask_m, mask_n, N, stride_om,
                    HAS_BIAS, HAS_SCALE, GATED, ACT)


@triton.jit
def _store_features(out, out_up, b_ptr, scale_ptr, out_ptr, rows, offs_m, offs_n, mask_m, mask_n, N, stride_om,
                    HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, GATED: tl.constexpr, ACT: tl.constexpr):
    """Scale, bias, the fused activation, and the store of ``[BLOCK_M, BLOCK_N]`` outputs."""
    if HAS_SCALE:
        out *= tl.load(scale_ptr + rows)[None, :]
        if GATED:
            out_up *= tl.load(scale_ptr + N + rows)[None, :]
    if HAS_BIAS:
        out += tl.load(b_ptr + rows).to(tl.float32)[None, :]
        if GATED:
            out_up += tl.load(b_ptr + N + rows).to(tl.float32)[None, :]
    if GATED:
        # Gate and up rounded to the activation dtype first, as the unfused
        # path stores them, then the gated op's own rounding steps.
        dtype = out_ptr.dtype.element_ty
        out = act_then_mul(out.to(dtype).to(tl.float32), out_up.to(dtype).to(tl.float32), ACT, dtype)
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    silu_mul: bool = False,
    config: GemvConfig | None = None,
    weight_scale: torch.Tensor | None = None,
    gated: str | None = None,
) -> torch.Tensor:
    """``x @ weight.T + bias`` for ``x`` of at most 8 rows;
    with ``gated`` (``"silu"``, ``"gelu"``, ``"gelu_tanh"``; ``silu_mul`` is
    ``gated="silu"``), ``act(gate) * up`` of that product (``weight`` = [gate; up]);
    with ``weight_scale``, ``weight`` is 8-bit and ``x @ (weight * scale[:, None]).T + bias``."""
    gated = "silu" if silu_mul else gated
    if gated is not None and gated not in GATED_ACTIVATIONS:
        raise ValueError(f"gemv gated activation {gated!r} is not one of {', '.join(GATED_ACTIVATIONS)}")
    num_tokens, in_features = x.shape
    if num_tokens > MAX_ROWS:
        raise ValueError(f"gemv takes at most {MAX_ROWS} token rows, got {num_tokens}")
    if weight.stride(1) != 1 or x.stride(1) != 1:
        raise ValueError("gemv needs x and weight contiguous along the input features")
    out_features = weight.shape[0] // 2 if gated else weight.shape[0]
    out = torch.empty(num_tokens, out_features, dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    config = config or default_config(gated is not None, num_tokens)
    block_k = min(config.block_k, triton.next_power_of_2(in_features))
    pdl = pdl_enabled(x.device, num_tokens)
    grid = (triton.cdiv(out_features, config.block_n),)
    _gemv_kernel[grid](
        x, weight, bias if bias is not None else weight, weight_scale if weight_scale is not None else weight, out,
        num_tokens, out_features, in_features, x.stride(0), weight.stride(0), out.stride(0),
        out_features * weight.stride(0),
        BLOCK_M=triton.next_power_of_2(num_tokens), BLOCK_N=config.block_n, BLOCK_K=block_k,
        HAS_BIAS=bias is not None, GATED=gated is not None, ACT=GATED_ACTIVATIONS.get(gated, SILU),
        DEFER_REDUCE=config.defer_reduce,
        EVEN_K=in_features % block_k == 0, HAS_SCALE=weight_scale is not None, PREFETCH=config.prefetch,
        STAGES=config.num_stages if config.pipelined else 1,
        PDL=pdl, num_warps=config.num_warps, num_stages=config.num_stages, launch_pdl=pdl,
    )
    return out


def linear_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The ``linear`` layer op for a few token rows (registered with ``max_tokens``);
    ``F.linear`` for inputs the kernel does not take (not 2-D, strided rows)."""
    if x.dim() == 2 and x.stride(1) == 1 and weight.stride(1) == 1:
        return gemv(x, weight, bias)
    return F.linear(x, weight, bias)


def gemv_silu_mul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The ``linear_silu_and_mul`` layer op: ``silu(gate) * up`` of
    ``x @ [gate; up].T + b`` in one launch (a few rows of ``x``)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    return gemv(x, weight, bias, gated="silu")


def gemv_gelu_tanh_mul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The ``linear_gelu_tanh_and_mul`` layer op: Gemma's GeGLU,
    ``gelu_tanh(gate) * up`` of ``x @ [gate; up].T + b`` in one launch."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    return gemv(x, weight, bias, gated="gelu_tanh")


def scaled_linear_gemv(
    x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """The ``fp8_linear`` and ``int8_weight_only_linear`` ops for a few token
    rows: the 8-bit weight streamed as stored (half the bytes of bfloat16)
    and scaled per output feature; activations are not quantized."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    if fp8_gemv_rows.takes(x2, qweight):  # one token of e4m3: the activations shared by rows
        return fp8_gemv_rows.fp8_gemv_rows(x2, qweight, weight_scale, bias).reshape(*x.shape[:-1], -1)
    # Half the bytes per weight: its best tiles may differ from 16-bit's (tuning runs set them).
    config = fit_to_rows(config_from_env("OCTAVO_GEMV_8BIT") or DEFAULT_8BIT_CONFIG, x2.shape[0])
    return gemv(x2, qweight, bias, config=config, weight_scale=weight_scale).reshape(*x.shape[:-1], -1)
