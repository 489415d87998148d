"""Conversations -> prompt text through the tokenizer's chat template.

Same rule as ``LLM.render_chat``: the template's text is tokenized with
``add_special_tokens=False`` because the template already holds any BOS it
wants (``prompts.encode_conversation``). A template that raises (e.g.
"roles must alternate") is the client's error: 400, not 500.

``continue_final_message`` (vLLM's name; the Anthropic route's assistant
prefill) renders the conversation without a generation prompt and cuts it
right after the last message's content, so that the answer continues that
message instead of opening a new turn. ``tools`` (OpenAI's shape) and
``template_kwargs`` (``chat_template_kwargs``, e.g. ``enable_thinking``) reach
the template as its ``tools`` and as variables of their own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from jinja2.exceptions import TemplateError

from octavo.errors import InvalidArgumentError

CHAT_ROLES = frozenset({"system", "user", "assistant", "tool"})
# OpenAI's newer name for the system role.
ROLE_ALIASES = {"developer": "system"}


def content_text(content: Any, param: str) -> str:
    """Message content: a string, None, or a list of text parts (``{"type": "text", "text": ...}``)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        part_type = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
        text = part.get("text") if isinstance(part, dict) else getattr(part, "text", None)
        if part_type != "text" or not isinstance(text, str):
            raise InvalidArgumentError(f"only text content is supported, got a {part_type!r} part", param=param)
        texts.append(text)
    return "\n".join(texts)


def content_with_images(content: Any, param: str, images: list) -> str | list[dict]:
    """Message content for a model that takes images: as ``content_text``, but
    ``image_url`` parts are appended to ``images`` (their URL) and the content
    becomes the list of parts templates of such models iterate
    (``{"type": "image"}``, ``{"type": "text", "text": ...}``)."""
    if content is None or isinstance(content, str):
        return text_parts(content)
    parts = []
    for index, part in enumerate(content):
        part_type = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
        if part_type == "image_pil" and isinstance(part, dict):  # vLLM's, for LLM.chat: a PIL image
            images.append(part.get("image_pil"))
            parts.append({"type": "image"})
        elif part_type == "image_url":
            url = part.get("image_url") if isinstance(part, dict) else getattr(part, "image_url", None)
            url = url.get("url") if isinstance(url, dict) else url
            if not isinstance(url, str):
                raise InvalidArgumentError("an image_url part is {'type': 'image_url', 'image_url': {'url': ...}}",
                                           param=f"{param}.{index}.image_url")
            images.append(url)
            parts.append({"type": "image"})
        else:
            parts.append({"type": "text", "text": content_text([part], param)})
    return parts


def text_parts(text: str | None) -> list[dict]:
    """Text content as the one part a template that walks content parts reads."""
    return [{"type": "text", "text": text or ""}]


def collects_images(tokenizer: Any, image_prompts: Any) -> list | None:
    """A list for a conversation's images where they are taken (the model has an image
    processor and its template walks content parts), else None: images are then refused."""
    return [] if image_prompts is not None and template_walks_content(tokenizer) else None


# A template that walks a message's content (``for part in message['content']``)
# wants the list of parts; others print it as a string.
_WALKS_CONTENT = re.compile(r"for\s+\w+\s+in\s+(?:message|messages\[[^\]]*\])(?:\[['\"]content['\"]\]|\.content)")


def template_walks_content(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template iterates over message content parts."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and _WALKS_CONTENT.search(template) is not None


def normalize_role(role: str, param: str) -> str:
    role = ROLE_ALIASES.get(role, role)
    if role not in CHAT_ROLES:
        raise InvalidArgumentError(f"unsupported message role {role!r} (system, user, assistant, tool)", param=param)
    return role


@dataclass(frozen=True)
class ChatOptions:
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tools: list[dict] | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    # vLLM's: documents for RAG templates (their ``documents`` variable), and
    # special tokens (a BOS) added on top of what the template writes.
    documents: list[dict] | None = None
    add_special_tokens: bool = False


def render_chat_text(
    tokenizer: Any, conversation: list[dict[str, Any]], options: ChatOptions, param: str = "messages"
) -> str:
    """The chat template's text for a conversation of ``{"role", "content", ...}`` dicts
    (``param``: the request field errors name)."""
    if tokenizer is None:
        raise InvalidArgumentError("this server has no tokenizer, so it cannot render chats", param=param)
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidArgumentError(
            "the model's tokenizer has no chat template; start the server with --chat-template FILE",
            param=param,
        )
    if options.add_generation_prompt and options.continue_final_message:
        raise InvalidArgumentError(
            "add_generation_prompt and continue_final_message exclude each other: a new turn is opened, or "
            "the last message is continued",
            param="continue_final_message",
        )
    try:
        return tokenizer.apply_chat_template(
            conversation,
            tools=options.tools,
            documents=options.documents,
            tokenize=False,
            add_generation_prompt=options.add_generation_prompt,
            continue_final_message=options.continue_final_message,
            **options.template_kwargs,
        )
    except (TemplateError, ValueError, TypeError) as exc:
        raise InvalidArgumentError(f"the chat template rejected the {param}: {exc}", param=param) from None
