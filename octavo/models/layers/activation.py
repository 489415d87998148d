"""Gated activations of an MLP's fused gate-up output: ``act(x[..., :d]) * x[..., d:]``.

``SiluAndMul`` (Llama, Mistral, Qwen), ``GeluAndMul`` (exact, or the tanh
approximation Gemma uses): the ``silu_and_mul`` / ``gelu_and_mul`` /
``gelu_tanh_and_mul`` layer ops, as resolved for the model.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from octavo.errors import UnsupportedModelError
from octavo.ops import LayerOps, current_layer_ops
from octavo.ops.reference import silu_and_mul as silu_and_mul_reference

__all__ = ["GeluAndMul", "SiluAndMul", "elementwise_activation", "gated_activation", "silu_and_mul_reference"]


class SiluAndMul(nn.Module):
    def __init__(self, ops: LayerOps | None = None) -> None:
        super().__init__()
        self.ops = ops or current_layer_ops()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.silu_and_mul(x)


class GeluAndMul(nn.Module):
    """``approximate``: ``"none"`` (exact, erf) or ``"tanh"``, as ``F.gelu`` names them."""

    def __init__(self, approximate: str = "none", ops: LayerOps | None = None) -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU approximation {approximate!r} is not one of 'none', 'tanh'")
        self.approximate = approximate
        ops = ops or current_layer_ops()
        self.op = ops.gelu_tanh_and_mul if approximate == "tanh" else ops.gelu_and_mul

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x)


# Hugging Face ``hidden_act`` names -> the gated activation layer computing
# exactly that function (``gelu_new`` and friends round differently: not here).
_GATED = {
    "silu": lambda ops: SiluAndMul(ops),
    "swish": lambda ops: SiluAndMul(ops),
    "gelu": lambda ops: GeluAndMul("none", ops),
    "gelu_pytorch_tanh": lambda ops: GeluAndMul("tanh", ops),
}


def gated_activation(hidden_act: str, ops: LayerOps | None = None) -> nn.Module:
    """The ``act(gate) * up`` layer for a config's ``hidden_act``; refuses others."""
    make = _GATED.get(hidden_act)
    if make is None:
        raise UnsupportedModelError(f"hidden_act {hidden_act!r} is not supported (supported: {', '.join(_GATED)})")
    return make(ops)


# The same names -> the plain elementwise function, for an ungated MLP (no
# layer op computes one: plain torch).
_ELEMENTWISE: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


def elementwise_activation(hidden_act: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """``act(x)`` for a config's ``hidden_act`` (an ungated MLP); refuses others."""
    act = _ELEMENTWISE.get(hidden_act)
    if act is None:
        raise UnsupportedModelError(f"hidden_act {hidden_act!r} is not supported (supported: {', '.join(_ELEMENTWISE)})")
    return act
