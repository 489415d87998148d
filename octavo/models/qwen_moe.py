"""Qwen2-MoE and Qwen3-MoE: the Qwen2/Qwen3 decoders with expert MLPs.

Qwen2-MoE adds a shared expert to every sparse layer, scaled per token by a
sigmoid gate, and has q/k/v biases (``qkv_bias``). Qwen3-MoE has no shared
expert and normalises each q and k head. Both may keep some layers dense
(``mlp_only_layers``, ``decoder_sparse_step``) and renormalise the top-k
weights or not (``norm_topk_prob``): see ``moe_config.py``.
"""

from octavo.models.llama import DecoderOptions
from octavo.models.moe_decoder import MoEForCausalLM


class Qwen2MoeForCausalLM(MoEForCausalLM):
    @classmethod
    def decoder_options(cls, config, dtype) -> DecoderOptions:
        return DecoderOptions(qkv_bias=bool(config.raw.get("qkv_bias", True)), o_bias=False)


class Qwen3MoeForCausalLM(MoEForCausalLM):
    @classmethod
    def decoder_options(cls, config, dtype) -> DecoderOptions:
        return DecoderOptions(qkv_bias=config.attention_bias, o_bias=config.attention_bias, qk_norm="head")
