"""Cohere's Command-R (``CohereForCausalLM``) and Command-R7B
(``Cohere2ForCausalLM``).

Both are the Llama decoder with one LayerNorm per layer, without a bias
(``layer_norm_eps``), whose output feeds the attention and the MLP side by
side (``layer_kind="parallel"``); RoPE over interleaved pairs
``(x[2i], x[2i+1])``, computed in float32 as HF does
(``InterleavedRotaryEmbedding``); the logits multiplied by ``logit_scale``;
tied embeddings by default. Command-R+ normalises each q and k head with a
LayerNorm of its own weights (``use_qk_norm``: ``q_norm.weight`` is
``[heads, head_dim]``).

Command-R7B has sliding-window layers with RoPE and global layers without
any (``layer_types``, or every ``sliding_window_pattern``-th layer global
in older configs; ``config.nope_layers`` holds the global ones, read in
``models/config.py``), and no q/k norms.
"""

from __future__ import annotations

import torch

from octavo.models.llama import DecoderOptions, LlamaForCausalLM


def cohere_options(config, qk_norm: bool) -> DecoderOptions:
    return DecoderOptions(
        qkv_bias=config.attention_bias, o_bias=config.attention_bias, qk_norm="head_layer" if qk_norm else None,
        norm_kind="layer", norm_eps=float(config.raw.get("layer_norm_eps", 1e-5)), layer_kind="parallel",
        rope_interleaved=True, logits_scale=float(config.raw.get("logit_scale", 0.0625)),
    )


class CohereForCausalLM(LlamaForCausalLM):
    @classmethod
    def decoder_options(cls, config, dtype: torch.dtype) -> DecoderOptions:
        return cohere_options(config, bool(config.raw.get("use_qk_norm", False)))


class Cohere2ForCausalLM(LlamaForCausalLM):
    @classmethod
    def decoder_options(cls, config, dtype: torch.dtype) -> DecoderOptions:
        return cohere_options(config, qk_norm=False)  # HF's Cohere2 has none, whatever the config says
