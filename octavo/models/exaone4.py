"""EXAONE 4.0 (``Exaone4ForCausalLM``): OLMo 2's layer (a norm after the
attention and after the MLP, none before them) with Llama's RMSNorm
rounding, an RMSNorm on every q and k head, and hybrid attention: with a
``sliding_window``, three sliding-window layers with RoPE for every global
one without it (``layer_types``; ``config.py`` makes the global layers
NoPE), otherwise RoPE and full attention everywhere."""

from __future__ import annotations

from octavo.models.llama import DecoderOptions, LlamaForCausalLM


class Exaone4ForCausalLM(LlamaForCausalLM):
    @classmethod
    def decoder_options(cls, config, dtype) -> DecoderOptions:
        return DecoderOptions(qk_norm="head", layer_kind="post_norm")
