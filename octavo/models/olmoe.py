"""OLMoE: 64 experts, top-8, an RMSNorm over all q (and all k) heads at once,
and optionally q, k and v clamped to ``clip_qkv``."""

from octavo.models.llama import DecoderOptions
from octavo.models.moe_decoder import MoEForCausalLM


class OlmoeForCausalLM(MoEForCausalLM):
    @classmethod
    def decoder_options(cls, config, dtype) -> DecoderOptions:
        clip = config.raw.get("clip_qkv")
        return DecoderOptions(
            qkv_bias=config.attention_bias, o_bias=config.attention_bias, qk_norm="full",
            clip_qkv=float(clip) if clip is not None else None,
        )
