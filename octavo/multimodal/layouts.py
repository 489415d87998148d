"""Where a model's images go in its prompt: the ``ImageLayout`` a model class's
``image_layout(multimodal_config, tokenizer)`` returns (the model contract's, so that a
plugin's model takes images without an entry here).

The chat template writes the image token once per image; the checkpoint's
own processor widens it into the ids the model expects, which a layout
reproduces from the processed pixels' size: LLaVA a fixed run of image tokens
(``models/llava.py``); Mistral 3 (Pixtral) a row of image tokens per merged
patch row, each row closed by ``[IMG_BREAK]``, the last by ``[IMG_END]``
(``models/mistral3.py``). Only the image-token positions take embedding rows
(the runner writes them in order); the others stay text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from octavo.errors import ModelLoadError


@dataclass(frozen=True)
class ImageLayout:
    """A fixed run of ``tokens_per_image`` image tokens per image (a subclass may
    make ``tokens`` depend on the image's size)."""

    image_token_id: int
    tokens_per_image: int
    # Keyword arguments for the image processor's call.
    processor_kwargs: dict = field(default_factory=dict)

    def tokens(self, height: int, width: int) -> list[int]:
        """The ids one processed image of ``height`` x ``width`` pixels stands for in the prompt."""
        return [self.image_token_id] * self.tokens_per_image


def tokenizer_token_id(tokenizer: Any, token: str) -> int:
    """``token``'s id in the tokenizer, or ModelLoadError where it has none (a layout needs it)."""
    token_id = tokenizer.convert_tokens_to_ids(token) if tokenizer is not None else None
    if not isinstance(token_id, int) or token_id == getattr(tokenizer, "unk_token_id", None):
        raise ModelLoadError(f"the tokenizer has no {token} token, which this model's images need")
    return token_id
