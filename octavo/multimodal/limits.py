"""How many images a prompt may show (vLLM's ``limit_mm_per_prompt``)."""

from __future__ import annotations

from typing import Any

from octavo.errors import InvalidArgumentError

# vLLM's default is 999 a modality; each image's pixel values travel with the
# request and its embedding rows are computed in one step, so Octavo keeps a
# bound that one request cannot turn into a stall for the others.
DEFAULT_IMAGES_PER_PROMPT = 8


def images_per_prompt(limit_mm_per_prompt: dict[str, Any] | None, model_takes_images: bool) -> int:
    """The engine's image limit per prompt: 0 for a model without images."""
    if limit_mm_per_prompt is not None and not isinstance(limit_mm_per_prompt, dict):
        raise InvalidArgumentError(
            f"limit_mm_per_prompt must be a JSON object such as {{\"image\": 4}}, got {limit_mm_per_prompt!r}",
            param="limit_mm_per_prompt")
    limits = dict(limit_mm_per_prompt or {})
    unknown = sorted(set(limits) - {"image"})
    if unknown:
        raise InvalidArgumentError(
            f"limit_mm_per_prompt names {unknown}; Octavo takes images only ('image')", param="limit_mm_per_prompt")
    image = limits.get("image", DEFAULT_IMAGES_PER_PROMPT if model_takes_images else 0)
    if isinstance(image, bool) or not isinstance(image, int) or image < 0:
        raise InvalidArgumentError(f"limit_mm_per_prompt's 'image' must be an integer >= 0, got {image!r}",
                                   param="limit_mm_per_prompt")
    if image and not model_takes_images:
        raise InvalidArgumentError("limit_mm_per_prompt allows images, but this model takes none",
                                   param="limit_mm_per_prompt")
    return image


def takes_images(arch) -> bool:
    """Whether the model class of ``arch`` (a ``ModelArchConfig``) embeds images."""
    from octavo.models.registry import resolve_model_class

    return bool(getattr(resolve_model_class(arch.architecture), "supports_images", False))
