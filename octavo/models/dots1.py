"""dots.llm1 (``Dots1ForCausalLM``): Qwen3's attention (an RMSNorm on every
q and k head; biases on all four projections where ``attention_bias`` says
so; sliding-window layers where ``layer_types`` names them) with DeepSeek
V3's mixture of experts (sigmoid routing with a correction bias over expert
groups, shared experts, the first ``first_k_dense_replace`` layers dense;
``moe_config.py``)."""

from __future__ import annotations

import torch

from octavo.models.llama import DecoderOptions
from octavo.models.moe_decoder import MoEForCausalLM


class Dots1ForCausalLM(MoEForCausalLM):
    checkpoint_renames = ((".shared_experts.", ".shared_expert."),)

    @classmethod
    def decoder_options(cls, config, dtype: torch.dtype) -> DecoderOptions:
        return DecoderOptions(qkv_bias=config.attention_bias, o_bias=config.attention_bias, qk_norm="head")
