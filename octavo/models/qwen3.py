"""Qwen3: the Llama decoder with an RMSNorm on every q and k head."""

from octavo.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True
