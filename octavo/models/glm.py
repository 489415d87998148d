"""GLM-4: ``GlmForCausalLM`` (GLM-4-9B-chat-hf) and ``Glm4ForCausalLM``
(the GLM-4-0414 checkpoints); GLM-4.5 / 4.6: ``Glm4MoeForCausalLM``.

Both are the Llama decoder with q/k/v biases (none on ``o_proj``), gate and
up fused in the checkpoint (``gate_up_proj``, split on the way in as
Phi-3's is) and RoPE over the first half of each q/k head
(``partial_rotary_factor`` 0.5, which GLM's configs imply when they leave it
out) in GLM's layout: interleaved pairs ``(x[2i], x[2i+1])`` turned by
frequency ``i``, not halves.

For an unquantized checkpoint the ``q_proj`` / ``k_proj`` rows (weights and
biases) that produce each head's rotary dims are reordered when loaded,
even rows then odd (as DeepSeek's are): the rotate-half rotation of the
reordered head gives the same q.k products as GLM's rotation of the
original, so the usual rotary kernels run it. A pre-quantized checkpoint's
rows may be packed or share block scales, so it keeps its rows and rotates
interleaved pairs at run time instead (``DecoderOptions.rope_interleaved``,
plain torch: a few more launches per layer).

GLM-4-0414 adds a norm after the attention and one after the MLP, before
each joins the residual stream: Gemma's sandwich layer under GLM's names
(its ``post_self_attn_layernorm`` is the sandwich's ``post_attention_layernorm``,
its ``post_attention_layernorm`` the ``pre_feedforward_layernorm``, its
``post_mlp_layernorm`` the ``post_feedforward_layernorm``), with Llama's
RMSNorm rounding (no float32 scaling, no weight offset).

GLM-4.5 (``Glm4MoeForCausalLM``) is the Llama decoder again, not GLM-4's:
q/k/v biases, per-head q/k RMSNorms where ``use_qk_norm`` says so, RoPE over
the first half of each head in the rotate-half layout (no reordering), and
DeepSeek V3's mixture of experts (sigmoid routing with a correction bias
over expert groups, shared experts, the first ``first_k_dense_replace``
layers dense; ``moe_config.py``). Its multi-token-prediction layer (the
checkpoint's layer ``num_hidden_layers``) is not used and its tensors are
skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from octavo.errors import UnsupportedModelError
from octavo.models.deepseek import deinterleave_rows
from octavo.models.llama import DecoderOptions
from octavo.models.moe_decoder import MoEForCausalLM
from octavo.models.phi3 import Phi3ForCausalLM

_QK_PROJECTIONS = (".self_attn.q_proj.", ".self_attn.k_proj.")


def reorders_rotary_rows(config) -> bool:
    """Whether the q/k rows are put in rotate-half order when loaded (an
    unquantized checkpoint), rather than rotated in GLM's layout at run time."""
    return not config.quantization_config


def rotary_rows_in_rotate_half_order(name: str, tensor: torch.Tensor, head_dim: int, rotary_dim: int) -> torch.Tensor:
    """``tensor`` (``name``: a ``q_proj`` / ``k_proj`` weight or bias) with each
    head's first ``rotary_dim`` rows even-then-odd: GLM's interleaved rotary
    pairs in the rotate-half layout."""
    if name.rsplit(".", 1)[-1] not in ("weight", "bias") or tensor.shape[0] % head_dim:
        # Only unquantized checkpoints come here (``reorders_rotary_rows``).
        raise UnsupportedModelError(
            f"{name} (shape {tuple(tensor.shape)}): GLM's q/k rows are reordered when loaded, "
            "which only plain weights and biases allow"
        )
    return deinterleave_rows(tensor, 0, rotary_dim, head_dim)


def glm_options(config, **options) -> DecoderOptions:
    return DecoderOptions(qkv_bias=config.attention_bias, rope_interleaved=not reorders_rotary_rows(config), **options)


class GlmForCausalLM(Phi3ForCausalLM):
    # The loader reorders q/k rows (``rotary_rows_in_rotate_half_order``): an
    # adapter's q/k B rows would not line up with them.
    supports_lora = False

    @classmethod
    def decoder_options(cls, config, dtype: torch.dtype) -> DecoderOptions:
        return glm_options(config)

    def _rotate_half_order(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        head_dim, rotary_dim = self.config.head_dim, self.config.rotary_dim
        for name, tensor in weights:
            if any(projection in name for projection in _QK_PROJECTIONS):
                tensor = rotary_rows_in_rotate_half_order(name, tensor, head_dim, rotary_dim)
            yield name, tensor

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        if self.options.rope_interleaved:  # rotated in GLM's own layout: rows as they are
            return super().load_weights(weights)
        return super().load_weights(self._rotate_half_order(weights))


class Glm4ForCausalLM(GlmForCausalLM):
    # GLM-4-0414's names -> the sandwich layer's (in this order: a name is
    # renamed by every pair in turn, and the first frees the name the second takes).
    checkpoint_renames = (
        (".post_attention_layernorm.", ".pre_feedforward_layernorm."),
        (".post_self_attn_layernorm.", ".post_attention_layernorm."),
        (".post_mlp_layernorm.", ".post_feedforward_layernorm."),
    )

    @classmethod
    def decoder_options(cls, config, dtype: torch.dtype) -> DecoderOptions:
        return glm_options(config, layer_kind="sandwich")


class Glm4MoeForCausalLM(MoEForCausalLM):
    checkpoint_renames = ((".shared_experts.", ".shared_expert."),)

    @classmethod
    def decoder_options(cls, config, dtype: torch.dtype) -> DecoderOptions:
        return DecoderOptions(qkv_bias=config.attention_bias, qk_norm="head" if config.raw.get("use_qk_norm") else None)
