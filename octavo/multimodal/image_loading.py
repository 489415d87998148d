"""An image from what a request carries: a PIL image (the Python API), a
``data:image/...;base64,`` URL or bare base64 (the HTTP APIs), or a
``file://`` path under ``--allowed-local-media-path``.

Remote URLs are refused: the server never fetches on a client's behalf (no
request can make it reach another host). Encoded bytes and decoded pixels
are both bounded, and a file that does not decode is the client's error.
"""

from __future__ import annotations

import base64
import binascii
import io
from pathlib import Path
from typing import Any

from octavo.errors import InvalidArgumentError

MAX_ENCODED_BYTES = 20 << 20
MAX_PIXELS = 6000 * 6000


def _pil():
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - the vision extra installs it
        raise InvalidArgumentError("images need Pillow on the server: pip install 'octavo[vision]'", param="image") from None
    return Image


def load_image(source: Any, allowed_local_path: str | None = None, param: str = "image"):
    """``source`` as an RGB PIL image, or InvalidArgumentError saying why not."""
    image_module = _pil()
    if isinstance(source, image_module.Image):
        return _checked(source, param)
    if not isinstance(source, str) or not source:
        raise InvalidArgumentError(f"an image must be a data URL or base64 text, got {type(source).__name__}", param=param)
    if source.startswith(("http://", "https://")):
        raise InvalidArgumentError(
            "image URLs are not fetched; send the image inline as a data URL (data:image/png;base64,...)", param=param)
    if source.startswith("file://"):
        return _decode(_local_file(source[len("file://"):], allowed_local_path, param), param)
    if source.startswith("data:"):
        header, _, source = source.partition(",")
        if not header.startswith("data:image/") or not header.endswith(";base64"):
            raise InvalidArgumentError("an image data URL must read data:image/<type>;base64,<data>", param=param)
    if len(source) > MAX_ENCODED_BYTES * 4 // 3 + 4:
        raise InvalidArgumentError(f"an image is larger than {MAX_ENCODED_BYTES >> 20} MiB", param=param)
    try:
        data = base64.b64decode(source, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgumentError("an image's base64 data does not decode", param=param) from None
    return _decode(data, param)


def _local_file(path: str, allowed_local_path: str | None, param: str) -> bytes:
    if allowed_local_path is None:
        raise InvalidArgumentError("file:// images need the server's --allowed-local-media-path", param=param)
    root, target = Path(allowed_local_path).resolve(), Path(path).resolve()
    if not target.is_relative_to(root) or not target.is_file():
        raise InvalidArgumentError(f"file:// images must name a file under {root}", param=param)
    if target.stat().st_size > MAX_ENCODED_BYTES:
        raise InvalidArgumentError(f"an image is larger than {MAX_ENCODED_BYTES >> 20} MiB", param=param)
    return target.read_bytes()


def _decode(data: bytes, param: str):
    image_module = _pil()
    try:
        image = image_module.open(io.BytesIO(data))
        width, height = image.size
        if width * height > MAX_PIXELS:  # checked before the pixels are decoded
            raise InvalidArgumentError(f"an image of {width}x{height} has more than {MAX_PIXELS} pixels", param=param)
        image.load()
    except InvalidArgumentError:
        raise
    except Exception as exc:  # PIL raises many types for a broken file
        raise InvalidArgumentError(f"the image does not decode: {type(exc).__name__}", param=param) from None
    return _checked(image, param)


def _checked(image, param: str):
    width, height = image.size
    if width < 1 or height < 1 or width * height > MAX_PIXELS:
        raise InvalidArgumentError(f"an image must have 1 to {MAX_PIXELS} pixels, got {width}x{height}", param=param)
    return image if image.mode == "RGB" else image.convert("RGB")
