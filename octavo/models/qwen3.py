"""Qwen3: the Llama decoder with an RMSNorm on every q and k head."""

from octavo.models.llama import DecoderOptions, LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    @classmethod
    def decoder_options(cls, config, dtype) -> DecoderOptions:
        return DecoderOptions(qkv_bias=config.attention_bias, o_bias=config.attention_bias, qk_norm="head")
