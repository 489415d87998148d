"""Qwen2: the Llama decoder with biases on q, k and v (never on o)."""

from octavo.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    @staticmethod
    def has_qkv_bias(config) -> bool:
        return True

    @staticmethod
    def has_o_bias(config) -> bool:
        return False
