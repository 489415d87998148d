"""gpt-oss (OpenAI): the shared decoder with attention sinks and biased,
clamped-SwiGLU experts.

What differs from Llama (facts from transformers' ``modeling_gpt_oss.py``):

* attention: biases on q/k/v/o (``attention_bias``), and a learned logit per
  head (``self_attn.sinks``) that joins every softmax's denominator without
  adding a value (``DecoderOptions.attention_sinks``; the backends' part is
  ``AttentionSpec.sinks``: on GPUs the layer runs on a backend that declares
  ``supports_sinks``, which the Triton ones do not yet);
* layers alternate between a sliding window (``sliding_window``, 128) and
  full attention (``layer_types``, sliding first);
* RoPE is YaRN (``factor`` 32 over 4,096 positions, ``truncate`` false) from
  ``rope_scaling`` / ``rope_parameters``;
* RMSNorm scales in float32 before rounding (``norm_in_float32``);
* every layer is a mixture of experts with a biased router (softmax over
  the top-k logits) and biased experts with a clamped SwiGLU
  (``layers/gpt_oss_moe.py``).

No CUDA graphs (``supports_graph_capture``): the experts synchronise with
the host once a layer. Checkpoints: 16/32-bit ones as transformers saves them, and the released
MXFP4 ones (``quantization_config`` ``quant_method`` ``mxfp4``), whose
experts are dequantized to the model dtype while loading (``mxfp4.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from octavo.errors import UnsupportedModelError
from octavo.models.base import ModelInitContext
from octavo.models.layers.gpt_oss_moe import GptOssMoeBlock
from octavo.models.llama import DecoderOptions, LlamaForCausalLM
from octavo.models.mxfp4 import dequantized_mxfp4
from octavo.models.weights import load_decoder_weights

# The YaRN keys ``layers/rotary.py`` reads; any other is refused by name.
_YARN_KEYS = frozenset({
    "rope_type", "type", "rope_theta", "factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
    "truncate", "attention_factor", "mscale", "mscale_all_dim",
})


def _check_config(config) -> None:
    quant = config.raw.get("quantization_config") or {}
    method = quant.get("quant_method")
    if method not in (None, "mxfp4"):
        raise UnsupportedModelError(
            f"{config.architecture}: checkpoints quantized with {method!r} are not supported "
            "(mxfp4 and unquantized ones are)"
        )
    if config.moe is None:
        raise UnsupportedModelError(f"{config.architecture}: config.json has no experts (num_local_experts)")
    rope = config.rope_parameters or {}
    if (rope.get("rope_type") or rope.get("type")) == "yarn":
        unknown = sorted(set(rope) - _YARN_KEYS)
        if unknown:
            raise UnsupportedModelError(f"config.json: YaRN option {unknown[0]!r} is not supported")


class GptOssForCausalLM(LlamaForCausalLM):
    # The experts' biases under the stacked parameters' names (``GptOssExperts``).
    checkpoint_renames = (
        (".experts.gate_up_proj_bias", ".experts.w13_bias"),
        (".experts.down_proj_bias", ".experts.w2_bias"),
    )
    # LoRA with gpt-oss is untested (its experts are not LoRA layers): refused.
    supports_lora = False
    # The plain-torch experts read each expert's token count on the host
    # (``clamped_swiglu_experts``), which a CUDA graph cannot capture: steps run eagerly.
    supports_graph_capture = False

    @classmethod
    def decoder_options(cls, config, dtype: torch.dtype) -> DecoderOptions:
        return DecoderOptions(
            qkv_bias=config.attention_bias, o_bias=config.attention_bias, norm_in_float32=True, attention_sinks=True,
        )

    def __init__(self, ctx: ModelInitContext) -> None:
        _check_config(ctx.config)
        super().__init__(ctx)
        self.weights_dtype = ctx.dtype

    def build_mlp(self, ctx: ModelInitContext, layer_index: int, prefix: str) -> nn.Module:
        return GptOssMoeBlock(ctx, prefix)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """As every decoder, after MXFP4 expert tensors are dequantized (a
        16/32-bit checkpoint has none)."""
        return load_decoder_weights(self, dequantized_mxfp4(weights, self.weights_dtype))
