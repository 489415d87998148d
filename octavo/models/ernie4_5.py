"""ERNIE 4.5 (Baidu, dense: ERNIE-4.5-0.3B): the Llama decoder with RoPE over
interleaved pairs ``(x[2i], x[2i+1])`` instead of halves
(``InterleavedRotaryEmbedding``: plain torch, the fused rotary kernels rotate
halves), one ``use_bias`` for every projection (read as ``attention_bias``
and ``mlp_bias`` in ``models/config.py``) and tied embeddings by default."""

from octavo.models.llama import DecoderOptions, LlamaForCausalLM


class Ernie4_5ForCausalLM(LlamaForCausalLM):
    @classmethod
    def decoder_options(cls, config, dtype) -> DecoderOptions:
        return DecoderOptions(qkv_bias=config.attention_bias, o_bias=config.attention_bias, rope_interleaved=True)
