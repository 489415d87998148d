"""``ImagePrompts``: a prompt's images -> its expanded token ids and ``ImageFeature``s.

Runs where requests are validated (the ``LLM`` front end, the server's
handlers, off the event loop), never in the engine's step loop: decoding and
resizing an image takes milliseconds that would stall every other request.
The pixel values come from the checkpoint's own image processor
(``preprocessor_config.json``, transformers' PIL backend); each image token
of the prompt is widened to the ids the model expects (``layouts.py``), as
the checkpoint's own processor does.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from octavo.core.image_features import ImageFeature, image_feature
from octavo.errors import InvalidArgumentError, ModelLoadError
from octavo.multimodal.image_loading import load_image
from octavo.multimodal.layouts import ImageLayout

logger = logging.getLogger(__name__)

# Threads decoding and processing images for the server (each image a few to a
# few hundred milliseconds of CPU; PIL and the processors release the GIL in part).
IMAGE_WORKERS = 2


class ImagePrompts:
    """The model's image processor and layout; ``apply`` turns a prompt's images into features."""

    def __init__(self, model_dir: str | Path, layout: ImageLayout, max_images: int,
                 allowed_local_path: str | None = None) -> None:
        from transformers import AutoImageProcessor

        try:
            self.processor = AutoImageProcessor.from_pretrained(str(model_dir), backend="pil")
        except TypeError:  # transformers before the backend argument
            self.processor = AutoImageProcessor.from_pretrained(str(model_dir), use_fast=False)
        self.layout = layout
        self.max_images = max_images
        self.allowed_local_path = allowed_local_path
        # The server's image work runs here, not on the tokenizer pool (``apply_async``).
        self._workers = ThreadPoolExecutor(max_workers=IMAGE_WORKERS, thread_name_prefix="octavo-images")

    async def apply_async(self, token_ids: list[int], images: list[Any], param: str = "prompt"):
        """``apply`` on the image workers: a burst of large images queues there, while other
        requests' text keeps the tokenizer pool."""
        return await asyncio.get_running_loop().run_in_executor(self._workers, self.apply, token_ids, images, param)

    def apply(self, token_ids: list[int], images: list[Any], param: str = "prompt") -> tuple[list[int], list[ImageFeature]]:
        """``token_ids`` with each image token widened, and one feature per image, in order."""
        if len(images) > self.max_images:
            raise InvalidArgumentError(
                f"the prompt has {len(images)} images, more than the {self.max_images} allowed (--limit-mm-per-prompt)",
                param=param)
        token = self.layout.image_token_id
        places = [i for i, t in enumerate(token_ids) if t == token]
        if len(places) != len(images):
            raise InvalidArgumentError(
                f"the prompt has {len(places)} image placeholders for {len(images)} images", param=param)
        if not images:
            return token_ids, []
        pixels = [self._pixels(load_image(image, self.allowed_local_path, param), param) for image in images]
        expanded, features = [], []
        previous = 0
        for place, values in zip(places, pixels):
            expanded.extend(token_ids[previous:place])
            widened = self.layout.tokens(values.shape[-2], values.shape[-1])
            features.append(image_feature(values, len(expanded), len(widened)))
            expanded.extend(widened)
            previous = place + 1
        expanded.extend(token_ids[previous:])
        return expanded, features

    def _pixels(self, image: Any, param: str):
        """One image's pixel values ``[C, H, W]``, processed alone (no padding to a batch's size)."""
        try:
            return self.processor(images=[image], return_tensors="pt", **self.layout.processor_kwargs)["pixel_values"][0]
        except (ValueError, TypeError, OSError) as exc:  # an image the processor cannot take is the client's
            raise InvalidArgumentError(f"the image processor refused an image: {exc}", param=param) from None


def image_prompts_for(args: Any, max_images: int, tokenizer: Any = None) -> ImagePrompts | None:
    """The front end's ``ImagePrompts`` for the engine built from ``args`` (an
    ``EngineArgs``, its model resolved to a directory), or None where the model
    takes no images."""
    if max_images == 0:
        return None
    from octavo.models.config import load_arch_config
    from octavo.models.registry import resolve_model_class

    arch = load_arch_config(Path(args.model), args.hf_overrides)
    make_layout = getattr(resolve_model_class(arch.architecture), "image_layout", None)
    if make_layout is None:
        raise ModelLoadError(f"{arch.architecture} embeds images but has no image_layout: its prompts cannot place them")
    if not (Path(args.model) / "preprocessor_config.json").is_file():
        logger.warning("%s has no preprocessor_config.json: it is served for text, images are refused", args.model)
        return None
    layout = make_layout(arch.raw.get("multimodal_config") or {}, tokenizer)
    return ImagePrompts(args.model, layout, max_images, args.allowed_local_media_path)


def with_image_features(engine: Any, prompt: Any, param: str = "prompt") -> Any:
    """vLLM's ``{"prompt" | "prompt_token_ids": ..., "multi_modal_data": {"image": ...}}``
    as the engine takes it (``image_features``, the ids widened); other prompts as they are."""
    if not isinstance(prompt, dict) or "multi_modal_data" not in prompt:
        return prompt
    data = prompt["multi_modal_data"]
    if not isinstance(data, dict) or set(data) - {"image"}:
        raise InvalidArgumentError("multi_modal_data takes images only: {'image': an image or a list of them}",
                                   param="multi_modal_data")
    images = data.get("image")
    images = [] if images is None else list(images) if isinstance(images, (list, tuple)) else [images]
    image_prompts = getattr(engine, "image_prompts", None)
    if image_prompts is None and images:
        raise InvalidArgumentError(
            "this model takes no images (or its checkpoint has no image processor config); send text only",
            param="multi_modal_data")
    text_prompt = {key: value for key, value in prompt.items() if key != "multi_modal_data"}
    text, token_ids = engine.tokenize_prompt(text_prompt)
    if not images:
        return {"prompt": text, "prompt_token_ids": token_ids} if text is not None else {"prompt_token_ids": token_ids}
    token_ids, features = image_prompts.apply(token_ids, images, param)
    # The text no longer spells the widened ids; keep it for the output's ``prompt`` field.
    return {"prompt": text, "prompt_token_ids": token_ids, "image_features": features}
