"""Vision-language checkpoints served for text: Gemma 3 (4B, 12B, 27B),
Qwen2-VL / Qwen2.5-VL and Qwen3-VL (dense and MoE). (Mistral Small 3.1 / 3.2,
once here, takes images now: ``mistral3.py`` builds on ``_text_only``.)

Their language model is a family Octavo has (Gemma 3, Qwen2, Qwen3), its
config nested under ``text_config`` (``config.py`` reads it from there,
taking the embedding tie and the quantization from the top level where the
text config leaves them out) and its weights under ``language_model.``
(older saves: ``language_model.model.`` and ``language_model.lm_head.``;
transformers 5: ``model.language_model.``; Qwen's: the plain names). The
vision tower's and projector's tensors have no parameter here and are
skipped. Qwen's M-RoPE (interleaved or not, Qwen3-VL's) gives every
position the same value in all of its sections when the input is text,
which is RoPE (``config.py`` reads it as such; Qwen3-VL's visual features
added to early layers come with images only). Images are not served: non-text content is a 400 on every route.
LoRA adapters are refused (their module names are the multimodal model's).

Qwen3-VL's MoE checkpoints store each layer's experts stacked as Qwen
released them, ``gate_up_proj`` ``[experts, hidden, 2 x intermediate]`` and
``down_proj`` ``[experts, intermediate, hidden]``, or as transformers 5
saves them, each transposed; the shapes say which (a model whose hidden
size is twice the experts' width could not tell: refused).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from octavo.errors import ModelLoadError

from octavo.models.gemma3 import Gemma3ForCausalLM
from octavo.models.llama import LlamaForCausalLM
from octavo.models.qwen2 import Qwen2ForCausalLM
from octavo.models.qwen3 import Qwen3ForCausalLM
from octavo.models.qwen_moe import Qwen3MoeForCausalLM

# Checkpoint name fragments -> the text model's (first match of each applies).
_LANGUAGE_MODEL_RENAMES = (
    ("model.language_model.", "model."),
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
)


def _text_only(family: type[LlamaForCausalLM], name: str) -> type[LlamaForCausalLM]:
    renames = _LANGUAGE_MODEL_RENAMES + tuple(getattr(family, "checkpoint_renames", ()))
    return type(name, (family,), {
        "checkpoint_renames": renames, "supports_lora": False, "__module__": __name__,
        "__doc__": f"{family.__name__}'s language model of a vision-language checkpoint, served for text.",
    })


Gemma3ForConditionalGeneration = _text_only(Gemma3ForCausalLM, "Gemma3ForConditionalGeneration")
Qwen2VLForConditionalGeneration = _text_only(Qwen2ForCausalLM, "Qwen2VLForConditionalGeneration")
Qwen2_5_VLForConditionalGeneration = _text_only(Qwen2ForCausalLM, "Qwen2_5_VLForConditionalGeneration")
Qwen3VLForConditionalGeneration = _text_only(Qwen3ForCausalLM, "Qwen3VLForConditionalGeneration")


class Qwen3VLMoeForConditionalGeneration(_text_only(Qwen3MoeForCausalLM, "_Qwen3VLMoeText")):
    """Qwen3-VL's MoE language model (Qwen3-MoE's), served for text."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights(self._experts_as_saved(weights))

    def _experts_as_saved(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """Stacked experts in transformers' layout ([E, 2I, H] and [E, H, I]), from Qwen's where they come so."""
        hidden, inter = self.config.hidden_size, self.config.moe.intermediate_size
        for name, tensor in weights:
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")) and tensor.dim() == 3:
                released = (hidden, 2 * inter) if name.endswith("gate_up_proj") else (inter, hidden)
                if released[0] == released[1]:
                    raise ModelLoadError(f"{name}: the stacked experts' layout cannot be told from its shape")
                if tuple(tensor.shape[1:]) == released:
                    tensor = tensor.transpose(1, 2)
            yield name, tensor
