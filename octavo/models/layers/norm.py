"""RMSNorm, with the residual add fused into the same call.

``RMSNorm``'s math is the ``rms_norm`` / ``fused_add_rms_norm`` layer ops
(``octavo.ops``; references match Hugging Face: normalise in float32, cast
back, then scale), as resolved for the model this layer belongs to.
``Float32ScaleRMSNorm`` (Gemma 2/3, OLMo 2) scales in float32 before
casting, by ``weight`` or, for Gemma, by ``1 + weight`` (the
``rms_norm_f32_scale`` ops). ``post_norm_add_norm`` is Gemma's sandwich
step, a block's norm, the residual add and the next norm, one op where
both norms are float32-scaled alike. ``RMSNorm.add_then_fp8_linear`` is the
norm and the fp8 projection after it, one op (the quantizer in the norm);
``add_then_linear`` the norm and an unquantized projection (the norm inside
the decode GEMV), ``add_then_route`` a MoE layer's norm, router and top-k.
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.ops import LayerOps, current_layer_ops
from octavo.ops.reference import rms_norm as rms_norm_reference
from octavo.ops.reference import rms_norm_f32_scale as rms_norm_f32_scale_reference

__all__ = [
    "Float32ScaleRMSNorm", "RMSNorm", "feeds_fp8_linear", "feeds_linear", "feeds_router", "fuses_with", "post_norm_add_norm", "rms_norm_f32_scale_reference",
    "rms_norm_reference",
]


class RMSNorm(nn.Module):
    def __init__(
        self, hidden_size: int, eps: float = 1e-6, dtype: torch.dtype = torch.float32, ops: LayerOps | None = None
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)
        self.eps = eps
        self.ops = ops or current_layer_ops()

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """``norm(x)``; with ``residual``: ``(norm(x + residual), x + residual)``."""
        if residual is None:
            return self.ops.rms_norm(x, self.weight, self.eps)
        return self.ops.fused_add_rms_norm(x, residual, self.weight, self.eps)

    def add_then_fp8_linear(self, x: torch.Tensor, residual: torch.Tensor, linear: nn.Module):
        """``(linear(norm(x + residual)), x + residual)`` for a column-parallel
        ``linear`` with fp8 weights (``feeds_fp8_linear``): the
        ``fused_add_rms_norm_fp8_linear`` op, which may quantize the norm's
        output in the norm's own pass."""
        return self.ops.fused_add_rms_norm_fp8_linear(
            x, residual, self.weight, self.eps, linear.weight, linear.weight_scale, linear.bias
        )

    def add_then_linear(self, x: torch.Tensor, residual: torch.Tensor, linear: nn.Module):
        """``(linear(norm(x + residual)), x + residual)`` for an unquantized
        column-parallel ``linear`` (``feeds_linear``): the
        ``fused_add_rms_norm_linear`` op, the norm inside the decode GEMV."""
        out, _, summed = self.ops.fused_add_rms_norm_linear(x, residual, self.weight, self.eps, linear.weight, linear.bias)
        return out, summed

    def add_then_route(self, x: torch.Tensor, residual: torch.Tensor, router_weight: torch.Tensor, top_k: int,
                       renormalize: bool):
        """``(topk_weights, topk_ids, norm(x + residual), x + residual)``: a
        MoE layer's norm, router and top-k, the ``fused_add_rms_norm_route`` op."""
        return self.ops.fused_add_rms_norm_route(x, residual, self.weight, self.eps, router_weight, top_k, renormalize)


def _served(norm: nn.Module, op: str) -> bool:
    """Whether an implementation serves ``op`` for ``norm``'s model (not only its composition)."""
    return bool(norm.ops.choice(op).chain)


def feeds_linear(norm: nn.Module, linear: nn.Module | None) -> bool:
    """Whether ``norm`` and the projection it feeds are one op
    (``RMSNorm.add_then_linear``): a Llama-rounded RMSNorm before an
    unquantized linear layer in the norm's dtype, where the platform has an
    implementation of ``fused_add_rms_norm_linear`` (its composition is the
    two calls as they were)."""
    from octavo.quantization.base import UnquantizedLinearMethod

    return (
        type(norm) is RMSNorm and type(getattr(linear, "quant_method", None)) is UnquantizedLinearMethod
        and linear.weight.dtype == norm.weight.dtype and _served(norm, "fused_add_rms_norm_linear")
        and linear.lora is None  # the fused op never sees the normed input a LoRA update needs
    )


def feeds_router(norm: nn.Module, moe_block: nn.Module) -> bool:
    """Whether ``norm``, the MoE block's router and its top-k are one op
    (``RMSNorm.add_then_route``): a Llama-rounded RMSNorm before a block with
    plain routing in the model's dtype, where the platform has an
    implementation of ``fused_add_rms_norm_route``. Otherwise the block
    routes itself (``fused_moe_routed``, which may pick experts in its kernels)."""
    return (
        type(norm) is RMSNorm and getattr(moe_block, "routes_after_norm", False)
        and _served(norm, "fused_add_rms_norm_route")
    )


def feeds_fp8_linear(norm: nn.Module, linear: nn.Module | None) -> bool:
    """Whether ``norm`` and the fp8 projection it feeds are one op
    (``RMSNorm.add_then_fp8_linear``): a Llama-rounded RMSNorm before a
    linear layer with per-channel fp8 weights."""
    from octavo.quantization.fp8 import Fp8LinearMethod

    return (
        type(norm) is RMSNorm and isinstance(getattr(linear, "quant_method", None), Fp8LinearMethod)
        and linear.lora is None  # as ``feeds_linear``
    )


class Float32ScaleRMSNorm(nn.Module):
    """RMSNorm scaled in float32 by ``weight_offset + weight`` (same call forms as ``RMSNorm``).

    Hugging Face rounds Gemma's and OLMo 2's norms differently from Llama's
    (scale, then cast), so they are their own layer ops:
    ``rms_norm_f32_scale`` / ``fused_add_rms_norm_f32_scale``."""

    def __init__(
        self, hidden_size: int, eps: float = 1e-6, dtype: torch.dtype = torch.float32, weight_offset: float = 0.0,
        ops: LayerOps | None = None,
    ):
        super().__init__()
        # Gemma stores the scale minus one (zeros = identity).
        self.weight = nn.Parameter(torch.full((hidden_size,), 1.0 - weight_offset, dtype=dtype), requires_grad=False)
        self.eps = eps
        self.weight_offset = weight_offset
        self.ops = ops or current_layer_ops()

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return self.ops.rms_norm_f32_scale(x, self.weight, self.eps, self.weight_offset)
        return self.ops.fused_add_rms_norm_f32_scale(x, residual, self.weight, self.eps, self.weight_offset)


def fuses_with(post: nn.Module, norm: nn.Module) -> bool:
    """Whether ``post_norm_add_norm(post, x, residual, norm)`` is one op: both
    float32-scaled norms with the same eps and offset (all of Gemma's)."""
    return (
        isinstance(post, Float32ScaleRMSNorm) and isinstance(norm, Float32ScaleRMSNorm)
        and post.eps == norm.eps and post.weight_offset == norm.weight_offset
    )


def post_norm_add_norm(post: nn.Module, x: torch.Tensor, residual: torch.Tensor, norm: nn.Module):
    """``(norm(post(x) + residual), post(x) + residual)``: the norm after a
    block, the residual add and the norm before the next block. One launch
    (``post_norm_add_rms_norm_f32_scale``) where ``fuses_with(post, norm)``;
    otherwise the two norms as they are."""
    if fuses_with(post, norm):
        return norm.ops.post_norm_add_rms_norm_f32_scale(
            x, residual, post.weight, norm.weight, norm.eps, norm.weight_offset
        )
    return norm(post(x), residual)
