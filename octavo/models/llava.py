"""LLaVA-1.5 (``LlavaForConditionalGeneration``): a CLIP vision tower
(``clip_vision.py``) or a SigLIP one (``siglip_vision.py``, as
llava-interleave-qwen's), a two-layer projector and a Llama, Mistral or Qwen2
language model.

The class is the language model's family itself (the decoder's options and
MLP are the family's, chosen by the text config's ``model_type``), with the
checkpoint renames of the text-only vision-language models
(``text_only.py``), plus the image side the engine calls: ``image_token_id``,
``tokens_per_image()``, ``image_embeddings(pixel_values)`` (tower, feature
selection, projector: transformers' ``get_image_features``) and
``embed_input_ids(input_ids)``; ``forward(..., inputs_embeds=)`` then takes
the token rows with the image rows put in. The vision tower reads the
multimodal part of config.json (``config.raw["multimodal_config"]``, kept
by ``config.py``). Not supported (refused at load): several feature layers
at once (a list ``vision_feature_layer``), vision towers other than CLIP's
and SigLIP's, and LoRA adapters.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from octavo.errors import ModelLoadError
from octavo.models.base import ModelInitContext
from octavo.models.clip_vision import ClipVisionTower, activation
from octavo.models.config import ModelArchConfig
from octavo.models.llama import DecoderOptions, LlamaForCausalLM
from octavo.models.mistral import MistralForCausalLM
from octavo.models.qwen2 import Qwen2ForCausalLM
from octavo.models.siglip_vision import SiglipVisionTower
from octavo.models.text_only import _LANGUAGE_MODEL_RENAMES
from octavo.models.vision_config import TakesImages, feature_layer, image_token, vision_sections
from octavo.models.weights import load_decoder_weights
from octavo.multimodal.layouts import ImageLayout

# The text config's model_type -> the family of the language model (HF's default is llama).
LANGUAGE_FAMILIES: dict[str, type[LlamaForCausalLM]] = {
    "llama": LlamaForCausalLM, "mistral": MistralForCausalLM, "qwen2": Qwen2ForCausalLM,
}
SELECT_STRATEGIES = ("default", "full")  # drop the first row (CLIP's class row) / keep it
# LlavaConfig's image token where config.json names none.
LLAVA_IMAGE_TOKEN = 32000
# vision_config.model_type -> the tower (the first is taken when config.json names none, as HF's default).
VISION_TOWERS: dict[str, type[nn.Module]] = {
    "clip_vision_model": ClipVisionTower, "siglip_vision_model": SiglipVisionTower,
}


def language_family(config: ModelArchConfig) -> type[LlamaForCausalLM]:
    model_type = config.model_type or "llama"
    family = LANGUAGE_FAMILIES.get(model_type)
    if family is None:
        raise ModelLoadError(
            f"LLaVA with a {model_type!r} language model is not supported ({', '.join(LANGUAGE_FAMILIES)} are)"
        )
    return family


@dataclass(frozen=True)
class LlavaVisionOptions:
    """The multimodal part of config.json, with LlavaConfig's defaults."""

    vision_config: dict[str, Any]
    image_token_id: int
    feature_layer: int
    select_strategy: str
    projector_act: str
    projector_bias: bool


def llava_vision_options(config: ModelArchConfig) -> LlavaVisionOptions:
    mm, vision = vision_sections(config, "LLaVA", tuple(VISION_TOWERS))
    layer = feature_layer(mm, -2)
    strategy = mm.get("vision_feature_select_strategy", "default")
    if strategy not in SELECT_STRATEGIES:
        supported = ", ".join(SELECT_STRATEGIES)
        raise ModelLoadError(
            f"config.json: vision_feature_select_strategy {strategy!r} is not supported ({supported} are)"
        )
    return LlavaVisionOptions(
        vision_config=vision, image_token_id=image_token(mm, LLAVA_IMAGE_TOKEN), feature_layer=layer,
        select_strategy=strategy,
        projector_act=mm.get("projector_hidden_act", "gelu"),
        projector_bias=bool(mm.get("multimodal_projector_bias", True)),
    )


def llava_image_rows(multimodal: dict[str, Any]) -> int:
    """Embedding rows of one image: the tower's rows (a row per patch, at the tower's
    own defaults where config.json leaves sizes out, and CLIP's class row), less the
    first under "default". transformers drops the first row whatever the tower, so
    SigLIP (no class row) under "default" loses a patch."""
    vision = multimodal.get("vision_config") or {}
    tower = VISION_TOWERS.get(vision.get("model_type"), ClipVisionTower)
    cfg = tower.full_config(vision)
    rows = (int(cfg["image_size"]) // int(cfg["patch_size"])) ** 2 + (1 if tower.class_row else 0)
    return rows - (1 if multimodal.get("vision_feature_select_strategy", "default") == "default" else 0)


def llava_layout(multimodal: dict[str, Any], tokenizer: Any) -> ImageLayout:
    """LLaVA's prompt layout: each image token widened to the image's rows."""
    return ImageLayout(image_token(multimodal, LLAVA_IMAGE_TOKEN), llava_image_rows(multimodal))


class LlavaMultiModalProjector(nn.Module):
    """Vision features -> the language model's embedding space: linear, activation, linear."""

    def __init__(self, vision_hidden: int, text_hidden: int, act: str, bias: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.act = activation(act, "projector_hidden_act")
        self.linear_1 = nn.Linear(vision_hidden, text_hidden, bias=bias, dtype=dtype)
        self.linear_2 = nn.Linear(text_hidden, text_hidden, bias=bias, dtype=dtype)
        self.requires_grad_(False)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(features)))


def vision_param_name(name: str) -> str | None:
    """The vision tower's or projector's parameter for a checkpoint tensor, or None
    for the language model's. LLaVA's releases save ``vision_tower.vision_model.*``
    and ``multi_modal_projector.*``; transformers 5 drops ``vision_model.`` and may
    put ``model.`` in front."""
    name = name.removeprefix("model.")
    if name.startswith("multi_modal_projector."):
        return name
    if name.startswith("vision_tower."):
        return "vision_tower." + name.removeprefix("vision_tower.").removeprefix("vision_model.")
    return None


class LlavaForConditionalGeneration(TakesImages, LlamaForCausalLM):
    """The language model (its family's decoder) with LLaVA's vision tower and projector."""

    checkpoint_renames = _LANGUAGE_MODEL_RENAMES
    image_layout = staticmethod(llava_layout)  # where the front end puts them in the prompt

    @classmethod
    def decoder_options(cls, config: ModelArchConfig, dtype: torch.dtype) -> DecoderOptions:
        return language_family(config).decoder_options(config, dtype)

    def build_mlp(self, ctx: ModelInitContext, layer_index: int, prefix: str) -> nn.Module:
        return language_family(self.config).build_mlp(self, ctx, layer_index, prefix)

    def __init__(self, ctx: ModelInitContext) -> None:
        options = llava_vision_options(ctx.config)  # refuse before building the language model
        super().__init__(ctx)
        self.image_token_id: int = options.image_token_id
        self.select_strategy = options.select_strategy
        tower = VISION_TOWERS[options.vision_config.get("model_type", "clip_vision_model")]
        self.vision_tower = tower(options.vision_config, ctx.dtype, options.feature_layer)
        vision_hidden = self.vision_tower.embeddings.patch_embedding.out_channels
        self.multi_modal_projector = LlavaMultiModalProjector(
            vision_hidden, ctx.config.hidden_size, options.projector_act, options.projector_bias, ctx.dtype
        )

    def tokens_per_image(self) -> int:
        """Embedding rows of one image (``llava_image_rows``: the layout's count too)."""
        return llava_image_rows(self.config.raw.get("multimodal_config") or {})

    def image_embeddings(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """``[N, C, H, W]`` pixel values (any float dtype) -> ``[N, tokens_per_image, hidden]`` in the model dtype."""
        features = self.vision_tower(pixel_values)
        if self.select_strategy == "default":  # transformers': the first row, whatever the tower
            features = features[:, 1:]
        return self.multi_modal_projector(features)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The language model's tensors as ``load_decoder_weights`` names them, the
        vision side's by ``vision_param_name``; tensors of layers past the
        feature layer (and ``post_layernorm``) have no parameter and are skipped."""
        return load_decoder_weights(self, weights, vision_param_name)
