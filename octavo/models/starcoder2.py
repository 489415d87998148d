"""StarCoder 2: the Llama decoder with LayerNorms that have a bias
(``norm_epsilon``), an ungated MLP (``c_fc`` -> tanh GELU -> ``c_proj``),
biases on every projection (``use_bias``, read as ``attention_bias`` and
``mlp_bias`` in ``models/config.py``), a sliding window in every layer
(``sliding_window``) and tied embeddings by default."""

from __future__ import annotations

import torch
from torch import nn

from octavo.models.base import ModelInitContext
from octavo.models.layers.ungated_mlp import UngatedMLP
from octavo.models.llama import DecoderOptions, LlamaForCausalLM


class Starcoder2ForCausalLM(LlamaForCausalLM):
    @classmethod
    def decoder_options(cls, config, dtype: torch.dtype) -> DecoderOptions:
        return DecoderOptions(
            qkv_bias=config.attention_bias, o_bias=config.attention_bias,
            norm_kind="layer_bias", norm_eps=float(config.raw.get("norm_epsilon", 1e-5)),
        )

    def build_mlp(self, ctx: ModelInitContext, layer_index: int, prefix: str) -> nn.Module:
        return UngatedMLP(ctx, prefix)
