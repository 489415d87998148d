"""OLMo 2: norms after the attention and after the MLP (none before them),
each scaled in float32, and an RMSNorm over all q (and all k) heads at once."""

from octavo.models.llama import DecoderOptions, LlamaForCausalLM


class Olmo2ForCausalLM(LlamaForCausalLM):
    @classmethod
    def decoder_options(cls, config, dtype) -> DecoderOptions:
        return DecoderOptions(
            qkv_bias=config.attention_bias, o_bias=config.attention_bias, qk_norm="full",
            norm_in_float32=True, layer_kind="post_norm",
        )
