"""The parts of a vision-language config.json every image-taking model reads the same way:
its vision tower's config (of a supported kind), one feature layer, the image token."""

from __future__ import annotations

from typing import Any

from octavo.errors import ModelLoadError
from octavo.models.config import ModelArchConfig


def vision_sections(
    config: ModelArchConfig, family: str, tower: str | tuple[str, ...]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the multimodal top level, its ``vision_config``), refused unless the tower is
    ``tower`` (or one of ``tower``'s kinds; a config naming none is taken as the first)."""
    towers = (tower,) if isinstance(tower, str) else tuple(tower)
    multimodal = config.raw.get("multimodal_config") or {}
    vision = multimodal.get("vision_config")
    if not isinstance(vision, dict):
        raise ModelLoadError(f"config.json: a {family} checkpoint needs the object 'vision_config'")
    kind = vision.get("model_type", towers[0])
    if kind not in towers:
        supported = " is" if len(towers) == 1 else " are"
        raise ModelLoadError(f"config.json: a {kind!r} vision tower is not supported ({', '.join(towers)}{supported})")
    return multimodal, vision


def feature_layer(multimodal: dict[str, Any], default: int) -> int:
    """``vision_feature_layer``: one layer's index (a list of layers is refused)."""
    layer = multimodal.get("vision_feature_layer", default)
    if not isinstance(layer, int) or isinstance(layer, bool):
        raise ModelLoadError(
            f"config.json: vision_feature_layer {layer!r} is not supported (one layer's index is, not several layers)"
        )
    return layer


def image_token(multimodal: dict[str, Any], default: int) -> int:
    """The image placeholder's id (``image_token_index``, or ``image_token_id``)."""
    token = next((multimodal[k] for k in ("image_token_index", "image_token_id") if multimodal.get(k) is not None), default)
    return int(token)


class TakesImages:
    """The model contract's image members common to LLaVA and Mistral 3 (a mixin before the
    decoder class): ``self.vision_tower`` has an ``image_size``, ``self.model`` embeds tokens
    unscaled (Llama, Mistral, Qwen2)."""

    supports_images = True  # the runner embeds its images (runtime/image_embeddings.py)
    supports_lora = False  # adapters name the multimodal model's modules

    def largest_image(self) -> tuple[int, int, int, int]:
        """The pixel-value shape of the largest image the processor sends (the start-up memory profile's)."""
        size = self.vision_tower.image_size
        return (1, 3, size, size)

    def embed_input_ids(self, input_ids):
        """The language model's token embeddings, which image rows are written over."""
        return self.model.embed_tokens(input_ids)
