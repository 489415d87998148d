"""Conversations -> prompt tokens through the tokenizer's chat template.

Same rule as ``LLM.render_chat``: the template's text is tokenized with
``add_special_tokens=False`` because the template already holds any BOS it
wants. A template that raises (e.g. "roles must alternate") is the client's
error: 400, not 500.
"""

from __future__ import annotations

from typing import Any

from jinja2.exceptions import TemplateError

from octavo.errors import InvalidArgumentError

CHAT_ROLES = frozenset({"system", "user", "assistant"})
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


def normalize_role(role: str, param: str) -> str:
    role = ROLE_ALIASES.get(role, role)
    if role not in CHAT_ROLES:
        raise InvalidArgumentError(f"unsupported message role {role!r} (system, user, assistant)", param=param)
    return role


def render_chat(tokenizer: Any, conversation: list[dict[str, str]], add_generation_prompt: bool = True):
    """Return ``(text, token_ids)`` for a conversation of ``{"role", "content"}`` dicts."""
    if tokenizer is None:
        raise InvalidArgumentError("this server has no tokenizer, so it cannot render chats", param="messages")
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidArgumentError(
            "the model's tokenizer has no chat template; start the server with --chat-template FILE",
            param="messages",
        )
    try:
        text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=add_generation_prompt)
    except (TemplateError, ValueError) as exc:
        raise InvalidArgumentError(f"the chat template rejected the messages: {exc}", param="messages") from None
    return text, list(tokenizer.encode(text, add_special_tokens=False))
