"""Images in ``LLM.chat`` conversations (OpenAI's content parts, as dicts)."""

from __future__ import annotations

from typing import Any

from octavo.entrypoints.openai.chat_template import content_with_images
from octavo.errors import InvalidArgumentError

_IMAGE_PARTS = frozenset({"image_url", "image_pil"})


def conversation_images(conversation: list[dict], takes_images: bool) -> tuple[list[dict], list[Any]]:
    """The conversation as the chat template reads it, and its images in order.

    Messages with ``image_url`` parts become the parts templates of
    vision-language models walk (``{"type": "image"}``); a conversation with
    no image is returned as it is. A model that takes no images refuses them."""
    if not any(_has_image(message) for message in conversation):
        return conversation, []
    if not takes_images:
        raise InvalidArgumentError("this model takes no images; send text only", param="messages")
    images: list[Any] = []
    rendered = []
    for position, message in enumerate(conversation):
        content = message.get("content") if isinstance(message, dict) else None
        parts = content_with_images(content, f"messages.{position}.content", images)
        rendered.append({**message, "content": parts})
    return rendered, images


def _has_image(message: Any) -> bool:
    content = message.get("content") if isinstance(message, dict) else None
    return isinstance(content, list) and any(isinstance(p, dict) and p.get("type") in _IMAGE_PARTS for p in content)
