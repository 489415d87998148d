"""A decoder layer's MLP without a gate: ``c_proj(act(c_fc(x)))`` (StarCoder 2).

``c_fc`` is split over tensor-parallel ranks by its outputs and ``c_proj``
by its inputs, as a gated MLP's projections are; the activation is
elementwise, so each rank applies it to its own slice. The activation is
plain torch (no layer op computes an ungated one): the exact GELU, its tanh
approximation or SiLU, as Hugging Face's ``hidden_act`` names them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from octavo.errors import UnsupportedModelError
from octavo.models.base import ModelInitContext
from octavo.models.layers.linear import ColumnParallelLinear, RowParallelLinear

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "swish": F.silu,
}


class UngatedMLP(nn.Module):
    """``c_proj(act(c_fc(x)))``, with biases where ``config.mlp_bias`` says."""

    def __init__(self, ctx: ModelInitContext, prefix: str) -> None:
        super().__init__()
        config = ctx.config
        act = _ACTIVATIONS.get(config.hidden_act)
        if act is None:
            raise UnsupportedModelError(
                f"hidden_act {config.hidden_act!r} is not supported (supported: {', '.join(_ACTIVATIONS)})"
            )
        self.act_fn = act
        self.c_fc = ColumnParallelLinear(
            config.hidden_size, [config.intermediate_size], bias=config.mlp_bias,
            quant_config=ctx.quant_config, prefix=f"{prefix}.c_fc", params_dtype=ctx.dtype,
        )
        self.c_proj = RowParallelLinear(
            config.intermediate_size, config.hidden_size, bias=config.mlp_bias,
            quant_config=ctx.quant_config, prefix=f"{prefix}.c_proj", params_dtype=ctx.dtype,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.act_fn(self.c_fc(x)))
