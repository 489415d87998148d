"""Granite: the Llama decoder with four multipliers: embeddings
(``embedding_multiplier``), attention scores (``attention_multiplier``
replaces ``head_dim ** -0.5``), each block's output before it joins the
residual stream (``residual_multiplier``) and the logits (divided by
``logits_scaling``)."""

from octavo.models.llama import DecoderOptions, LlamaForCausalLM


class GraniteForCausalLM(LlamaForCausalLM):
    @classmethod
    def decoder_options(cls, config, dtype) -> DecoderOptions:
        raw = config.raw
        return DecoderOptions(
            qkv_bias=config.attention_bias,
            o_bias=config.attention_bias,
            attention_scale=float(raw.get("attention_multiplier", 1.0)),
            embed_scale=float(raw.get("embedding_multiplier", 1.0)),
            residual_scale=float(raw.get("residual_multiplier", 1.0)),
            logits_divisor=float(raw.get("logits_scaling", 1.0)),
        )
