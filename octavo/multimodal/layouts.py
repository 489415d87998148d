"""Where a model's images go in its prompt: the ``ImageLayout`` a model class's
``image_layout(multimodal_config, tokenizer)`` returns (the model contract's, so that a
plugin's model takes images without an entry here).

The chat template writes the image token once per image; the checkpoint's
own processor widens it into the ids the model expects, which a layout
reproduces from the processed pixels' size: LLaVA-1.5 a fixed run of image
tokens; Mistral 3 (Pixtral) a row of image tokens per merged patch row,
each row closed by ``[IMG_BREAK]``, the last by ``[IMG_END]``. Only the
image-token positions take embedding rows (the runner writes them in
order); the others stay text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from octavo.errors import ModelLoadError


def _image_token(multimodal: dict[str, Any], default: int | None = None) -> int:
    token = multimodal.get("image_token_index", multimodal.get("image_token_id", default))
    if not isinstance(token, int):
        raise ModelLoadError("the checkpoint's config names no image token (image_token_index)")
    return token


@dataclass(frozen=True)
class ImageLayout:
    """A fixed run of ``tokens_per_image`` image tokens per image."""

    image_token_id: int
    tokens_per_image: int
    # Keyword arguments for the image processor's call.
    processor_kwargs: dict = field(default_factory=dict)

    def tokens(self, height: int, width: int) -> list[int]:
        """The ids one processed image of ``height`` x ``width`` pixels stands for in the prompt."""
        return [self.image_token_id] * self.tokens_per_image


@dataclass(frozen=True)
class GridLayout(ImageLayout):
    """Mistral 3's: rows of image tokens over the merged patch grid, with break and end ids."""

    multimodal: dict = field(default_factory=dict)
    break_id: int = -1
    end_id: int = -1

    def tokens(self, height: int, width: int) -> list[int]:
        from octavo.models.mistral3 import mistral3_image_tokens

        ids = {"image": self.image_token_id, "break": self.break_id, "end": self.end_id}
        return mistral3_image_tokens(self.multimodal, height, width, ids)


def llava_layout(multimodal: dict[str, Any], tokenizer: Any) -> ImageLayout:
    """LLaVA's: the tower's rows (a CLIP tower's patches and class row, a SigLIP
    tower's patches), less the first under the "default" strategy, as
    transformers drops it whatever the tower."""
    vision = multimodal.get("vision_config") or {}
    rows = (int(vision.get("image_size", 336)) // int(vision.get("patch_size", 14))) ** 2
    rows += 1 if vision.get("model_type", "clip_vision_model") == "clip_vision_model" else 0
    rows -= 1 if multimodal.get("vision_feature_select_strategy", "default") == "default" else 0
    return ImageLayout(_image_token(multimodal), rows)


def mistral3_layout(multimodal: dict[str, Any], tokenizer: Any) -> ImageLayout:
    """Mistral Small 3.1 / 3.2's: its processor sizes each image to whole merged patches
    (``patch_size`` x ``spatial_merge_size`` pixels), which the call is told, as
    transformers' PixtralProcessor tells it."""
    vision = multimodal.get("vision_config") or {}
    merged = int(vision.get("patch_size", 14)) * int(multimodal.get("spatial_merge_size", 2))
    ids = {name: _token_id(tokenizer, name) for name in ("[IMG_BREAK]", "[IMG_END]")}
    return GridLayout(_image_token(multimodal, 10), 0, {"patch_size": merged}, multimodal,
                      ids["[IMG_BREAK]"], ids["[IMG_END]"])


def _token_id(tokenizer: Any, token: str) -> int:
    token_id = tokenizer.convert_tokens_to_ids(token) if tokenizer is not None else None
    if not isinstance(token_id, int) or token_id == getattr(tokenizer, "unk_token_id", None):
        raise ModelLoadError(f"the tokenizer has no {token} token, which this model's images need")
    return token_id

