"""The registry of named layer ops: each op's signature, reference and tolerance.

An op's *signature* is its reference's (``reference.py``,
``quant_reference.py``): an implementation must accept the same
positional arguments and return the same kind of result. Its *contract*
is the reference's docstring. Its *tolerance* is how far an
implementation's output may be from the reference's on the same inputs,
per activation dtype: elementwise ``|ours - ref| <= atol + rtol * |ref|``,
or, for ops whose implementations may quantize activations, a bound on
``||ours - ref|| / ||ref||``. The conformance kit checks every registered
implementation against these.

Adding an op is additive (a plugin API minor version): a reference, a
spec here (``since`` that version), and a field of ``LayerOps``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from octavo.ops import quant_reference, reference

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
ACTIVATION_DTYPES = (F32, BF16, F16)


@dataclass(frozen=True)
class Tolerance:
    atol: float = 0.0
    rtol: float = 0.0
    # When set, the bound is on the relative error norm instead of elementwise.
    relative_norm: float | None = None

    def describe(self) -> str:
        if self.relative_norm is not None:
            return f"||err|| <= {self.relative_norm:g} ||ref||"
        return f"atol {self.atol:g}, rtol {self.rtol:g}"


# Elementwise ops and skinny GEMMs: float32 to accumulation order; half
# precision within about two ulps of the output (kernels round once where
# the reference rounds per operation).
ELEMENTWISE = {F32: Tolerance(1e-5, 1e-5), F16: Tolerance(2e-3, 2e-3), BF16: Tolerance(1.6e-2, 1.6e-2)}
GEMM = {F32: Tolerance(1e-4, 1e-4), F16: Tolerance(4e-3, 4e-3), BF16: Tolerance(2e-2, 2e-2)}
# GGUF: a kernel may use the float32 dequantized weights where the reference
# rounds them to the activation dtype first; with GGUF's wide scale ranges
# outputs that cancel then miss an elementwise half-precision bound by a few
# ulps of the larger terms (Q5_K/Q6_K in bfloat16 on an H100, round 32).
GGUF = {F32: Tolerance(1e-4, 1e-4), F16: Tolerance(relative_norm=4e-3), BF16: Tolerance(relative_norm=2e-2)}
# Attention: softmax-weighted sums accumulated in float32, rounded once: a GEMM's bounds.
ATTENTION = GEMM
# fp8 W8A8 quantizes activations to 3 mantissa bits: up to 2**-4 relative per element.
FP8 = {dtype: Tolerance(relative_norm=0.08) for dtype in ACTIVATION_DTYPES}


@dataclass(frozen=True)
class OpSpec:
    name: str
    reference: Callable
    tolerance: dict[torch.dtype, Tolerance]
    summary: str
    # Fused ops whose fallback is a composition of already-resolved ops
    # (e.g. linear then silu_and_mul) rather than their own reference.
    compose: Callable[[dict[str, Callable]], Callable] | None = None
    composed_of: tuple[str, ...] = ()
    # Arguments an implementation may overwrite (rotated in place), and
    # arguments that are outputs (a cache it writes into); all others must
    # come back unchanged. The conformance kit checks both.
    may_modify: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    dtypes: tuple[torch.dtype, ...] = ACTIVATION_DTYPES
    # The plugin API version that added the op: a plugin declaring an older
    # one cannot have been written against it, and is refused if it registers it.
    since: tuple[int, int] = (1, 1)
    # The weight arguments an implementation with its own layout (``OpImpl.repack``)
    # may hold in that layout instead; empty: the op takes none.
    weights: tuple[str, ...] = ()
    params: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        names = tuple(inspect.signature(self.reference).parameters)
        object.__setattr__(self, "params", names)

    @property
    def repack_params(self) -> tuple[str, ...]:
        """What ``OpImpl.repack`` is called with, by name: the op's arguments
        other than the activations (the first) and the bias."""
        return tuple(name for name in self.params[1:] if name != "bias")

    @property
    def signature(self) -> inspect.Signature:
        return inspect.signature(self.reference)

    def describe_signature(self) -> str:
        return f"{self.name}{self.signature}"


def _compose_linear_silu_and_mul(ops: dict[str, Callable]) -> Callable:
    linear, silu_and_mul = ops["linear"], ops["silu_and_mul"]

    def linear_then_silu_and_mul(x, weight, bias):
        return silu_and_mul(linear(x, weight, bias))

    return linear_then_silu_and_mul


def _compose_linear_gelu_tanh_and_mul(ops: dict[str, Callable]) -> Callable:
    linear, gelu_tanh_and_mul = ops["linear"], ops["gelu_tanh_and_mul"]

    def linear_then_gelu_tanh_and_mul(x, weight, bias):
        return gelu_tanh_and_mul(linear(x, weight, bias))

    return linear_then_gelu_tanh_and_mul


def _compose_norm_fp8_linear(ops: dict[str, Callable]) -> Callable:
    norm, fp8_linear = ops["fused_add_rms_norm"], ops["fp8_linear"]

    def fused_add_rms_norm_then_fp8_linear(x, residual, norm_weight, eps, qweight, weight_scale, bias):
        normed, summed = norm(x, residual, norm_weight, eps)
        return fp8_linear(normed, qweight, weight_scale, bias), summed

    return fused_add_rms_norm_then_fp8_linear


def _compose_fused_moe_routed(ops: dict[str, Callable]) -> Callable:
    topk_softmax, fused_moe = ops["moe_topk_softmax"], ops["fused_moe"]

    def topk_softmax_then_fused_moe(x, w13, w2, router_logits, top_k, renormalize, activation):
        weights, ids = topk_softmax(router_logits, top_k, renormalize)
        return fused_moe(x, w13, w2, weights, ids, activation)

    return topk_softmax_then_fused_moe


def _compose_qk_rms_norm(ops: dict[str, Callable]) -> Callable:
    rms_norm, rms_norm_f32_scale = ops["rms_norm"], ops["rms_norm_f32_scale"]

    def two_rms_norms(query, key, q_weight, k_weight, eps, weight_offset):
        if weight_offset is None:
            return rms_norm(query, q_weight, eps), rms_norm(key, k_weight, eps)
        return rms_norm_f32_scale(query, q_weight, eps, weight_offset), rms_norm_f32_scale(key, k_weight, eps, weight_offset)

    return two_rms_norms


def _compose_silu_and_mul_fp8_linear(ops: dict[str, Callable]) -> Callable:
    silu_and_mul, fp8_linear = ops["silu_and_mul"], ops["fp8_linear"]

    def silu_and_mul_then_fp8_linear(x, qweight, weight_scale, bias):
        return fp8_linear(silu_and_mul(x), qweight, weight_scale, bias)

    return silu_and_mul_then_fp8_linear


def _compose_norm_linear(ops: dict[str, Callable]) -> Callable:
    norm, linear = ops["fused_add_rms_norm"], ops["linear"]

    def fused_add_rms_norm_then_linear(x, residual, norm_weight, eps, weight, bias):
        normed, summed = norm(x, residual, norm_weight, eps)
        return linear(normed, weight, bias), normed, summed

    return fused_add_rms_norm_then_linear


def _compose_norm_route(ops: dict[str, Callable]) -> Callable:
    norm_linear, topk_softmax = ops["fused_add_rms_norm_linear"], ops["moe_topk_softmax"]

    def norm_router_then_topk(x, residual, norm_weight, eps, router_weight, top_k, renormalize):
        logits, normed, summed = norm_linear(x, residual, norm_weight, eps, router_weight, None)
        weights, ids = topk_softmax(logits, top_k, renormalize)
        return weights, ids, normed, summed

    return norm_router_then_topk


_SPECS = (
    OpSpec("rms_norm", reference.rms_norm, ELEMENTWISE, "RMSNorm"),
    OpSpec("fused_add_rms_norm", reference.fused_add_rms_norm, ELEMENTWISE, "residual add, then RMSNorm"),
    OpSpec("rms_norm_f32_scale", reference.rms_norm_f32_scale, ELEMENTWISE, "RMSNorm scaled in float32 (Gemma, OLMo 2)"),
    OpSpec(
        "fused_add_rms_norm_f32_scale", reference.fused_add_rms_norm_f32_scale, ELEMENTWISE,
        "residual add, then RMSNorm scaled in float32",
    ),
    OpSpec(
        "post_norm_add_rms_norm_f32_scale", reference.post_norm_add_rms_norm_f32_scale, ELEMENTWISE,
        "float32-scaled RMSNorm, residual add, float32-scaled RMSNorm (Gemma's sandwich layers)",
    ),
    OpSpec(
        "rotary_embedding", reference.rotary_embedding, ELEMENTWISE, "rotary embedding (rotate half) of q and k",
        may_modify=("query", "key"),
    ),
    OpSpec(
        "rotary_and_cache", reference.rotary_and_cache, ELEMENTWISE,
        "rotary embedding and the KV-cache write in one (backends with fuses_rotary)",
        may_modify=("query",), writes=("kv_cache",),
    ),
    OpSpec("silu_and_mul", reference.silu_and_mul, ELEMENTWISE, "SiLU(gate) * up"),
    OpSpec("gelu_and_mul", reference.gelu_and_mul, ELEMENTWISE, "GELU(gate) * up, exact"),
    OpSpec("gelu_tanh_and_mul", reference.gelu_tanh_and_mul, ELEMENTWISE, "GELU(gate) * up, tanh approximation"),
    OpSpec("linear", reference.linear, GEMM, "unquantized linear layer (skinny-batch kernels)"),
    OpSpec(
        "linear_silu_and_mul", reference.linear_silu_and_mul, GEMM, "gate-up projection fused with SiLU-and-mul",
        compose=_compose_linear_silu_and_mul, composed_of=("linear", "silu_and_mul"),
    ),
    OpSpec(
        "linear_gelu_tanh_and_mul", reference.linear_gelu_tanh_and_mul, GEMM,
        "gate-up projection fused with tanh-GELU-and-mul (Gemma's GeGLU)",
        compose=_compose_linear_gelu_tanh_and_mul, composed_of=("linear", "gelu_tanh_and_mul"),
    ),
    OpSpec("moe_topk_softmax", reference.moe_topk_softmax, ELEMENTWISE, "MoE router: softmax, top-k, renormalise"),
    OpSpec("fused_moe", reference.fused_moe, GEMM, "routed experts' weighted MLP sum"),
    OpSpec("fp8_linear", quant_reference.fp8_linear, FP8, "fp8 e4m3 per-channel weights"),
    OpSpec("fp8_block_linear", quant_reference.fp8_block_linear, FP8, "fp8 e4m3 weights with block-wise scales"),
    OpSpec("int8_linear", quant_reference.int8_linear, GEMM, "int8 W8A8, dynamic per-token activations"),
    OpSpec("int8_weight_only_linear", quant_reference.int8_weight_only_linear, GEMM, "int8 per-channel weights"),
    OpSpec("int4_linear", quant_reference.int4_linear, GEMM, "int4 grouped weights (GPTQ/AWQ/RTN layout)",
           weights=("qweight", "scales", "zeros")),
    OpSpec("int8_grouped_linear", quant_reference.int8_grouped_linear, GEMM, "int8 grouped weights with zero points (GPTQ 8-bit)"),
    OpSpec("gguf_linear", quant_reference.gguf_linear, GGUF, "GGUF (ggml) quantized rows"),
    OpSpec(
        "fused_add_rms_norm_fp8_linear", quant_reference.fused_add_rms_norm_fp8_linear, FP8,
        "residual add and RMSNorm feeding an fp8 projection (the quantizer fused into the norm)",
        compose=_compose_norm_fp8_linear, composed_of=("fused_add_rms_norm", "fp8_linear"), since=(1, 2),
    ),
    OpSpec(
        "silu_and_mul_fp8_linear", quant_reference.silu_and_mul_fp8_linear, FP8,
        "SiLU-and-mul feeding an fp8 down projection (the quantizer fused into the activation)",
        compose=_compose_silu_and_mul_fp8_linear, composed_of=("silu_and_mul", "fp8_linear"), since=(1, 2),
    ),
    OpSpec(
        "encoder_attention", reference.encoder_attention, ATTENTION,
        "bidirectional attention within each sequence of a flat batch (encoder-only models)", since=(1, 3),
    ),
    OpSpec(
        "fused_moe_routed", reference.fused_moe_routed, GEMM,
        "the router's softmax top-k and the experts in one op (an implementation may route inside its kernels)",
        compose=_compose_fused_moe_routed, composed_of=("moe_topk_softmax", "fused_moe"), since=(1, 4),
    ),
    OpSpec(
        "qk_rms_norm", reference.qk_rms_norm, ELEMENTWISE,
        "per-head RMSNorm of a step's queries and keys (Qwen3, Gemma 3) in one op",
        compose=_compose_qk_rms_norm, composed_of=("rms_norm", "rms_norm_f32_scale"), since=(1, 4),
    ),
    OpSpec(
        "fused_add_rms_norm_linear", reference.fused_add_rms_norm_linear, GEMM,
        "residual add and RMSNorm feeding an unquantized projection (the norm inside the decode GEMV)",
        compose=_compose_norm_linear, composed_of=("fused_add_rms_norm", "linear"), since=(1, 5),
    ),
    OpSpec(
        "fused_add_rms_norm_route", reference.fused_add_rms_norm_route, GEMM,
        "residual add and RMSNorm before a MoE layer, its router and top-k (one launch at decode)",
        compose=_compose_norm_route, composed_of=("fused_add_rms_norm_linear", "moe_topk_softmax"), since=(1, 5),
    ),
    OpSpec(
        "layer_norm", reference.layer_norm, ELEMENTWISE,
        "LayerNorm, with or without a bias, scaled in float32 (StarCoder 2, Cohere; Cohere's per-head q/k norms)",
        since=(1, 6),
    ),
)

# In resolution order: an op composed of others comes after them.
OP_SPECS: dict[str, OpSpec] = {spec.name: spec for spec in _SPECS}


def op_names() -> list[str]:
    return list(OP_SPECS)
