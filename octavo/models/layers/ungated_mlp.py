"""A decoder layer's MLP without a gate: ``c_proj(act(c_fc(x)))`` (StarCoder 2).

``c_fc`` is split over tensor-parallel ranks by its outputs and ``c_proj``
by its inputs, as a gated MLP's projections are; the activation is
elementwise, so each rank applies it to its own slice. The activation is
plain torch (no layer op computes an ungated one): the exact GELU, its tanh
approximation or SiLU, as Hugging Face's ``hidden_act`` names them
(``layers/activation.py``'s ``elementwise_activation``).
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.models.base import ModelInitContext
from octavo.models.layers.activation import elementwise_activation
from octavo.models.layers.linear import ColumnParallelLinear, RowParallelLinear


class UngatedMLP(nn.Module):
    """``c_proj(act(c_fc(x)))``, with biases where ``config.mlp_bias`` says."""

    def __init__(self, ctx: ModelInitContext, prefix: str) -> None:
        super().__init__()
        config = ctx.config
        self.act_fn = elementwise_activation(config.hidden_act)
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
