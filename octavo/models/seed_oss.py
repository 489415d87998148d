"""Seed-OSS (ByteDance): the Llama decoder with its biases flagged apart:
``attention_bias`` for q/k/v, ``attention_out_bias`` for o_proj and
``mlp_bias`` for the MLP (the released models: q/k/v only). Dropout
settings are training-only."""

from octavo.models.llama import DecoderOptions, LlamaForCausalLM


class SeedOssForCausalLM(LlamaForCausalLM):
    @classmethod
    def decoder_options(cls, config, dtype) -> DecoderOptions:
        return DecoderOptions(
            qkv_bias=config.attention_bias, o_bias=bool(config.raw.get("attention_out_bias", False)),
        )
