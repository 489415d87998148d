"""ERNIE 4.5 (Baidu; dense: ERNIE-4.5-0.3B): the Llama decoder with RoPE over
interleaved pairs ``(x[2i], x[2i+1])`` instead of halves
(``InterleavedRotaryEmbedding``: plain torch, the fused rotary kernels rotate
halves), one ``use_bias`` for every projection (read as ``attention_bias``
and ``mlp_bias`` in ``models/config.py``) and tied embeddings by default.

ERNIE 4.5 MoE (ERNIE-4.5-21B-A3B, 300B-A47B: ``Ernie4_5_MoeForCausalLM``) is
the same decoder with a mixture of experts in the layers
``moe_layer_start_index`` / ``_interval`` / ``_end_index`` name: a softmax
router whose choice adds a correction bias (stored as
``moe_statics.e_score_correction_bias`` of shape ``[1, experts]``),
renormalised weights, shared experts (``moe_config.py``)."""

from collections.abc import Iterable, Iterator

import torch

from octavo.models.llama import DecoderOptions, LlamaForCausalLM
from octavo.models.moe_decoder import MoEForCausalLM


class Ernie4_5ForCausalLM(LlamaForCausalLM):
    @classmethod
    def decoder_options(cls, config, dtype) -> DecoderOptions:
        return DecoderOptions(qkv_bias=config.attention_bias, o_bias=config.attention_bias, rope_interleaved=True)


class Ernie4_5_MoeForCausalLM(MoEForCausalLM):
    checkpoint_renames = (
        (".shared_experts.", ".shared_expert."), (".gate.moe_statics.", ".gate."), (".mlp.moe_statics.", ".mlp.gate."),
        ("lm_head.bias", "lm_head_bias"),
    )

    @classmethod
    def decoder_options(cls, config, dtype) -> DecoderOptions:
        return Ernie4_5ForCausalLM.decoder_options(config, dtype)

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        # Its LM head has a bias where ``use_bias`` says so (the dense model's never does).
        self.lm_head_bias = None
        if ctx.config.attention_bias and self.lm_head is not None:
            self.lm_head_bias = torch.nn.Parameter(torch.zeros(ctx.config.vocab_size, dtype=ctx.dtype), requires_grad=False)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden_states)
        return logits if self.lm_head_bias is None else logits + self.lm_head_bias

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights(_flat_correction_bias(weights))


def _flat_correction_bias(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in weights:
        if name.endswith("e_score_correction_bias"):
            tensor = tensor.reshape(-1)  # [1, experts]: one group
        yield name, tensor
