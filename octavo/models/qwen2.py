"""Qwen2: the Llama decoder with biases on q, k and v (never on o)."""

from octavo.models.llama import DecoderOptions, LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    @classmethod
    def decoder_options(cls, config, dtype) -> DecoderOptions:
        return DecoderOptions(qkv_bias=True, o_bias=False)
