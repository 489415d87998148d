"""Gemma 3 (text only): Gemma 2's decoder plus an RMSNorm on every q and k
head, a RoPE base of its own for the sliding-window layers
(``rope_parameters["sliding_attention"]`` or ``rope_local_base_freq``), and
five sliding layers for every global one. Bidirectional attention (the
embedding variant) is refused."""

from octavo.errors import UnsupportedModelError
from octavo.models.gemma2 import gemma_options
from octavo.models.llama import DecoderOptions, LlamaForCausalLM


class Gemma3ForCausalLM(LlamaForCausalLM):
    @classmethod
    def decoder_options(cls, config, dtype) -> DecoderOptions:
        if config.raw.get("use_bidirectional_attention"):
            raise UnsupportedModelError("config.json: use_bidirectional_attention is not supported (causal attention only)")
        return gemma_options(config, dtype, qk_norm="head")
