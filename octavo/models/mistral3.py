"""Mistral Small 3.1 / 3.2 (``Mistral3ForConditionalGeneration``): a Pixtral vision
tower (``pixtral_vision.py``), Mistral 3's projector (RMSNorm, a learned merge
of each ``spatial_merge_size`` x ``spatial_merge_size`` group of patches,
linear, activation, linear) and a Mistral language model.

The class is the Mistral decoder with the checkpoint renames of the
text-only vision-language models (``text_only.py``), plus the image side the
engine calls (``runtime/image_embeddings.py``): ``image_token_id``,
``image_embeddings(pixel_values)`` for one image at its own size (tower,
feature layer, projector: transformers' ``get_image_features``) and
``embed_input_ids(input_ids)``; ``forward(..., inputs_embeds=)`` then takes
the token rows with the image rows put in. An image's rows depend on its
size; ``mistral3_image_tokens`` gives the placeholder ids a prompt holds for
it (``[IMG]`` per merged patch, ``[IMG_BREAK]`` after each row, ``[IMG_END]``
last), as transformers' ``PixtralProcessor`` writes them. Not supported
(refused at load): several feature layers at once (a list
``vision_feature_layer``), vision towers other than Pixtral's, LoRA adapters.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from octavo.errors import InvalidArgumentError, ModelLoadError
from octavo.models.base import ModelInitContext
from octavo.models.clip_vision import activation
from octavo.models.config import ModelArchConfig
from octavo.models.mistral import MistralForCausalLM
from octavo.models.pixtral_vision import PixtralVisionTower, VisionRMSNorm, pixtral_config
from octavo.models.text_only import _text_only
from octavo.models.vision_config import TakesImages, feature_layer, image_token, vision_sections
from octavo.models.weights import load_decoder_weights
from octavo.multimodal.layouts import ImageLayout, tokenizer_token_id


# Mistral3Config's image token ([IMG]) where config.json names none.
MISTRAL3_IMAGE_TOKEN = 10


@dataclass(frozen=True)
class Mistral3VisionOptions:
    """The multimodal part of config.json, with Mistral3Config's defaults."""

    vision_config: dict[str, Any]
    image_token_id: int
    feature_layer: int
    merge: int
    projector_act: str
    projector_bias: bool


def _int_option(mm: dict[str, Any], key: str, default: int) -> int:
    value = mm.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ModelLoadError(f"config.json: {key} {value!r} is not supported (one integer is)")
    return value


def mistral3_vision_options(config: ModelArchConfig) -> Mistral3VisionOptions:
    mm, vision = vision_sections(config, "Mistral 3", "pixtral")
    layer = feature_layer(mm, -1)
    merge = _int_option(mm, "spatial_merge_size", 2)
    if merge < 1:
        raise ModelLoadError(f"config.json: spatial_merge_size {merge} is not supported")
    return Mistral3VisionOptions(
        vision_config=vision, image_token_id=image_token(mm, MISTRAL3_IMAGE_TOKEN), feature_layer=layer, merge=merge,
        projector_act=mm.get("projector_hidden_act", "gelu"),
        projector_bias=bool(mm.get("multimodal_projector_bias", False)),
    )


def merged_patch_size(multimodal_config: dict[str, Any]) -> int:
    """Pixels a side of one merged patch: the tower's patch (its default where config.json
    leaves it out) times ``spatial_merge_size``."""
    vision = pixtral_config(multimodal_config.get("vision_config") or {})
    return int(vision["patch_size"]) * int(multimodal_config.get("spatial_merge_size", 2))


def merged_grid(multimodal_config: dict[str, Any], height: int, width: int) -> tuple[int, int]:
    """(rows, columns) of merged patches of an image of ``height`` x ``width`` pixels:
    HF floors both the patch grid and its merge groups."""
    step = merged_patch_size(multimodal_config)
    return height // step, width // step


def mistral3_image_tokens(multimodal_config: dict, height: int, width: int, token_ids: dict) -> list[int]:
    """The placeholder ids for one processed image of ``height`` x ``width`` pixels
    (``token_ids``: the tokenizer's ``[IMG]``, ``[IMG_BREAK]`` and ``[IMG_END]`` as
    "image", "break", "end"): for each row of merged patches, an image id per
    column then a break, the last row's break replaced by the end id. Only the
    image ids take embedding rows; breaks and the end stay tokens."""
    rows, cols = merged_grid(multimodal_config, height, width)
    if rows < 1 or cols < 1:
        raise InvalidArgumentError(f"an image of {height}x{width} pixels has no whole merged patch")
    tokens = ([token_ids["image"]] * cols + [token_ids["break"]]) * rows
    tokens[-1] = token_ids["end"]
    return tokens


@dataclass(frozen=True)
class Mistral3Layout(ImageLayout):
    """Mistral 3's prompt layout: rows of image tokens over the merged patch grid, with break and end ids."""

    multimodal: dict = field(default_factory=dict)
    break_id: int = -1
    end_id: int = -1

    def tokens(self, height: int, width: int) -> list[int]:
        ids = {"image": self.image_token_id, "break": self.break_id, "end": self.end_id}
        return mistral3_image_tokens(self.multimodal, height, width, ids)


def mistral3_layout(multimodal: dict[str, Any], tokenizer: Any) -> ImageLayout:
    """Mistral Small 3.1 / 3.2's: its processor sizes each image to whole merged patches,
    which the call is told, as transformers' PixtralProcessor tells it."""
    return Mistral3Layout(
        image_token(multimodal, MISTRAL3_IMAGE_TOKEN), 0, {"patch_size": merged_patch_size(multimodal)}, multimodal,
        tokenizer_token_id(tokenizer, "[IMG_BREAK]"), tokenizer_token_id(tokenizer, "[IMG_END]"),
    )


class Mistral3PatchMerger(nn.Module):
    """Each ``merge`` x ``merge`` group of the patch grid as one row, then a linear map back to the vision width."""

    def __init__(self, hidden: int, merge: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.merge = merge
        self.merging_layer = nn.Linear(hidden * merge * merge, hidden, bias=False, dtype=dtype)

    def forward(self, features: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        m, dim = self.merge, features.shape[-1]
        grid = features.reshape(rows, cols, dim)[: rows // m * m, : cols // m * m]  # HF's unfold drops a partial group
        groups = grid.reshape(rows // m, m, cols // m, m, dim)
        # HF's torch unfold lays out each group channel-major: (channel, row in group, column in group).
        groups = groups.permute(0, 2, 4, 1, 3).reshape((rows // m) * (cols // m), dim * m * m)
        return self.merging_layer(groups)


class Mistral3MultiModalProjector(nn.Module):
    def __init__(self, vision_hidden: int, text_hidden: int, options: Mistral3VisionOptions, eps: float,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.norm = VisionRMSNorm(vision_hidden, eps, dtype)  # the text config's epsilon, as HF's
        self.patch_merger = Mistral3PatchMerger(vision_hidden, options.merge, dtype)
        self.act = activation(options.projector_act, "projector_hidden_act")
        self.linear_1 = nn.Linear(vision_hidden, text_hidden, bias=options.projector_bias, dtype=dtype)
        self.linear_2 = nn.Linear(text_hidden, text_hidden, bias=options.projector_bias, dtype=dtype)
        self.requires_grad_(False)

    def forward(self, features: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        merged = self.patch_merger(self.norm(features), rows, cols)
        return self.linear_2(self.act(self.linear_1(merged)))


def vision_param_name(name: str) -> str | None:
    """The vision tower's or projector's parameter for a checkpoint tensor, or None for the
    language model's: ``vision_tower.*`` and ``multi_modal_projector.*`` as Mistral's
    HF releases and transformers' ``save_pretrained`` name them, ``model.`` in front in memory."""
    name = name.removeprefix("model.")
    return name if name.startswith(("vision_tower.", "multi_modal_projector.")) else None


class Mistral3ForConditionalGeneration(TakesImages, _text_only(MistralForCausalLM, "_Mistral3Text")):
    """The Mistral language model with Pixtral's vision tower and Mistral 3's projector."""

    image_layout = staticmethod(mistral3_layout)  # where the front end puts them in the prompt

    def __init__(self, ctx: ModelInitContext) -> None:
        options = mistral3_vision_options(ctx.config)  # refuse before building the language model
        super().__init__(ctx)
        self.image_token_id: int = options.image_token_id
        self.vision_tower = PixtralVisionTower(options.vision_config, ctx.dtype, options.feature_layer)
        vision_hidden = self.vision_tower.ln_pre.weight.shape[0]
        self.multi_modal_projector = Mistral3MultiModalProjector(
            vision_hidden, ctx.config.hidden_size, options, ctx.config.rms_norm_eps, ctx.dtype
        )

    def image_embeddings(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """One image's pixel values ``[1, C, H, W]`` (any float dtype; H and W multiples of
        the patch size, the image's own size, unpadded) -> ``[1, rows, hidden]`` in the
        model dtype, ``rows`` = (H / patch / merge) x (W / patch / merge), row-major."""
        rows, cols = self.vision_tower.grid(pixel_values)
        features = self.vision_tower(pixel_values)
        return self.multi_modal_projector(features, rows, cols)[None]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The language model's tensors as ``load_decoder_weights`` names them, the
        vision side's by ``vision_param_name``; tensors of layers past the feature
        layer have no parameter and are skipped."""
        return load_decoder_weights(self, weights, vision_param_name)
