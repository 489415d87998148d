"""A decoder layer's dense gated MLP: ``down(act(gate(x)) * up(x))``.

The gate and up projections are one (``MergedColumnParallelLinear``); at
decode the projection and its activation are one layer op where the
weights are unquantized (``linear_silu_and_mul`` / ``linear_gelu_tanh_and_mul``)
and the activation and an fp8 down projection another
(``silu_and_mul_fp8_linear``).
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.models.base import ModelInitContext
from octavo.models.layers.activation import GeluAndMul, SiluAndMul, gated_activation
from octavo.models.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from octavo.quantization.base import UnquantizedLinearMethod
from octavo.quantization.fp8 import Fp8LinearMethod


class DecoderMLP(nn.Module):
    """``down(act(gate(x)) * up(x))``; ``reduce_results=False`` leaves TP partial sums."""

    def __init__(self, ctx: ModelInitContext, prefix: str, intermediate_size: int | None = None, reduce_results: bool = True):
        super().__init__()
        config = ctx.config
        size = intermediate_size or config.intermediate_size
        self.act_fn = gated_activation(config.hidden_act, ctx.ops)
        self.gate_up_proj = MergedColumnParallelLinear(
            config.hidden_size, [size] * 2, bias=config.mlp_bias,
            quant_config=ctx.quant_config, prefix=f"{prefix}.gate_up_proj", params_dtype=ctx.dtype,
        )
        self.down_proj = RowParallelLinear(
            size, config.hidden_size, bias=config.mlp_bias, quant_config=ctx.quant_config,
            prefix=f"{prefix}.down_proj", params_dtype=ctx.dtype, reduce_results=reduce_results,
        )
        # An unquantized gate-up projection and its SiLU (or Gemma's tanh
        # GELU) are one op, ``linear_silu_and_mul`` / ``linear_gelu_tanh_and_mul``
        # (one launch at decode where the platform has it; otherwise the
        # resolved linear, then the activation op). Exact-GELU MLPs and
        # quantized projections take the projection, then their activation op.
        self.linear_act_and_mul = None
        # A layer with LoRA computes through its own ``product`` (the fused ops skip the updates).
        if type(self.gate_up_proj.quant_method) is UnquantizedLinearMethod and self.gate_up_proj.lora is None:
            if isinstance(self.act_fn, SiluAndMul):
                self.linear_act_and_mul = ctx.ops.linear_silu_and_mul
            elif isinstance(self.act_fn, GeluAndMul) and self.act_fn.approximate == "tanh":
                self.linear_act_and_mul = ctx.ops.linear_gelu_tanh_and_mul
        # SiLU-and-mul and an fp8 down projection are one op,
        # ``silu_and_mul_fp8_linear`` (the activation quantized in its own pass).
        self.silu_fp8_down = (
            isinstance(self.act_fn, SiluAndMul) and isinstance(self.down_proj.quant_method, Fp8LinearMethod)
            and self.down_proj.lora is None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.linear_act_and_mul is not None:
            up = self.gate_up_proj
            return self.down_proj(self.linear_act_and_mul(x, up.weight, up.bias))
        return self.after_gate_up(self.gate_up_proj(x))

    def after_gate_up(self, gate_up: torch.Tensor) -> torch.Tensor:
        """The MLP after its gate-up projection (``gate_up``: its output)."""
        if not self.silu_fp8_down:
            return self.down_proj(self.act_fn(gate_up))
        down = self.down_proj
        fused = down.ops.silu_and_mul_fp8_linear
        return down.reduced(lambda: fused(gate_up, down.weight, down.weight_scale, down.bias))
