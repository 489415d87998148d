"""Mistral: the Llama decoder with an optional sliding window (from config)."""

from octavo.models.llama import LlamaForCausalLM


class MistralForCausalLM(LlamaForCausalLM):
    pass
