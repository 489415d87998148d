"""Gemma 2: the shared decoder with Gemma's particulars.

Norms scale by ``1 + weight`` in float32 and sit before and after both the
attention and the MLP; the MLP is GeGLU (tanh-approximated GELU); embeddings
are multiplied by ``sqrt(hidden_size)`` rounded to the model dtype (as
Hugging Face does); attention scores are scaled by
``query_pre_attn_scalar ** -0.5`` and soft-capped at
``attn_logit_softcapping``, the final logits at ``final_logit_softcapping``;
layers alternate between a sliding window and full attention
(``layer_types``, or every other layer starting with a sliding one).
"""

from __future__ import annotations

import torch

from octavo.models.llama import DecoderOptions, LlamaForCausalLM


def gemma_options(config, dtype: torch.dtype, qk_norm: str | None = None) -> DecoderOptions:
    raw = config.raw
    scalar = raw.get("query_pre_attn_scalar") or config.head_dim
    attn_cap, final_cap = raw.get("attn_logit_softcapping"), raw.get("final_logit_softcapping")
    return DecoderOptions(
        qkv_bias=config.attention_bias,
        o_bias=config.attention_bias,
        qk_norm=qk_norm,
        norm_in_float32=True,
        norm_weight_offset=1.0,
        layer_kind="sandwich",
        attention_scale=float(scalar) ** -0.5,
        attn_soft_cap=float(attn_cap) if attn_cap is not None else None,
        final_soft_cap=float(final_cap) if final_cap is not None else None,
        embed_scale=float(torch.tensor(config.hidden_size**0.5, dtype=torch.float32, device="cpu").to(dtype)),
    )


class Gemma2ForCausalLM(LlamaForCausalLM):
    @classmethod
    def decoder_options(cls, config, dtype) -> DecoderOptions:
        return gemma_options(config, dtype)
