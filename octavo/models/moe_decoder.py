"""The shared decoder with mixture-of-experts MLPs (Mixtral, Qwen2/3-MoE, OLMoE).

Each layer's MLP is a ``SparseMoeBlock`` where the config's
``moe.sparse_layers`` says so, else the family's dense MLP. Checkpoints
whose weights are already quantized (a ``quantization_config`` other than
GGUF's, whose expert tensors Octavo dequantizes) are refused: the experts
have no quantized kernels yet. Online quantization (``--quantization``)
quantizes the attention and dense projections and leaves the experts in the
model dtype.
"""

from __future__ import annotations

from torch import nn

from octavo.errors import UnsupportedModelError
from octavo.models.base import ModelInitContext
from octavo.models.layers.moe import SparseMoeBlock
from octavo.models.llama import DecoderMLP, LlamaForCausalLM


class MoEForCausalLM(LlamaForCausalLM):
    def __init__(self, ctx: ModelInitContext) -> None:
        method = (ctx.config.quantization_config or {}).get("quant_method")
        if method not in (None, "gguf"):
            raise UnsupportedModelError(
                f"{ctx.config.architecture}: checkpoints quantized with {method!r} are not supported for "
                "mixture-of-experts models (their experts have no quantized kernels); load the unquantized checkpoint"
            )
        super().__init__(ctx)

    def build_mlp(self, ctx: ModelInitContext, layer_index: int, prefix: str) -> nn.Module:
        moe = ctx.config.moe
        if not moe.sparse_layers[layer_index]:
            return DecoderMLP(ctx, prefix)
        shared = None
        if moe.shared_expert_intermediate_size:
            shared = DecoderMLP(ctx, f"{prefix}.shared_expert", moe.shared_expert_intermediate_size, reduce_results=False)
        return SparseMoeBlock(ctx, prefix, shared)
