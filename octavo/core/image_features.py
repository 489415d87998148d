"""``ImageFeature``: one image of a prompt as the engine carries it.

Plain values only (bytes, ints, strings) so that the engine process and the
workers receive it as msgpack (``distributed/serialization.py`` registers
it). ``identifier`` is a SHA-256 of the pixel values: two prompts that show
the same image at the same place share prefix-cache blocks; a different
image at the same place never does (``block_extra_keys``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from octavo.errors import InvalidArgumentError

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class ImageFeature:
    """The processor's pixel values of one image and the prompt span that stands for it."""

    data: bytes  # the pixel values' bytes (C order)
    shape: tuple[int, ...]
    dtype: str  # a key of _DTYPES
    offset: int  # index of the first placeholder token in the prompt
    length: int  # the span's tokens: the image tokens (a row each) and any others between them (Mistral's breaks)
    identifier: str  # SHA-256 hex of dtype, shape and data

    @property
    def end(self) -> int:
        return self.offset + self.length

    def pixel_values(self) -> torch.Tensor:
        """The pixel values as a tensor (a copy: the bytes are read-only)."""
        array = np.frombuffer(self.data, dtype=np.uint8).copy()
        return torch.from_numpy(array).view(_DTYPES[self.dtype]).reshape(self.shape)


def image_feature(pixel_values: torch.Tensor, offset: int, length: int) -> ImageFeature:
    """An ``ImageFeature`` for ``pixel_values`` (one image's, any shape) at ``offset``."""
    values = pixel_values.detach().contiguous().cpu()
    dtype = next((name for name, d in _DTYPES.items() if d == values.dtype), None)
    if dtype is None:
        values, dtype = values.float(), "float32"
    data = values.view(torch.uint8).numpy().tobytes() if values.numel() else b""
    digest = hashlib.sha256(f"{dtype}{tuple(values.shape)}".encode())
    digest.update(data)
    return ImageFeature(data, tuple(values.shape), dtype, offset, length, digest.hexdigest())


def check_features(features: Sequence[ImageFeature], num_prompt_tokens: int, param: str = "prompt") -> None:
    """Raise unless the features' spans lie inside the prompt, in order, apart."""
    previous_end = 0
    for feature in features:
        if not isinstance(feature, ImageFeature):
            raise InvalidArgumentError(f"an image feature must be an ImageFeature, got {type(feature).__name__}", param=param)
        if feature.dtype not in _DTYPES or feature.length < 1 or feature.offset < previous_end:
            raise InvalidArgumentError("image features must have a known dtype and ordered, disjoint spans", param=param)
        if feature.end > num_prompt_tokens:
            raise InvalidArgumentError(
                f"an image's placeholder span [{feature.offset}, {feature.end}) runs past the prompt's "
                f"{num_prompt_tokens} tokens", param=param)
        previous_end = feature.end


def block_extra_keys(features: Sequence[ImageFeature], start: int, end: int) -> bytes:
    """The identifiers of the images whose span meets token positions ``[start, end)``
    (what a prefix-cache block of those positions depends on beyond its token ids)."""
    return b"".join(f.identifier.encode() for f in features if f.offset < end and f.end > start)
