"""OpenAI chat messages -> the conversation a chat template renders.

Besides text turns, the history may hold an assistant's ``tool_calls`` (their
``arguments`` JSON text becomes an object, which is what templates print
with ``tojson``), ``tool`` results (``tool_call_id`` kept), and an
assistant's ``reasoning_content`` (templates that show past reasoning read
it). ``chat_template_kwargs`` reach the template as variables (e.g.
``enable_thinking``), except names the renderer itself uses.
"""

from __future__ import annotations

import json
from typing import Any

from octavo.entrypoints.openai.chat_template import content_text, content_with_images, normalize_role
from octavo.errors import InvalidArgumentError

# apply_chat_template's own arguments: a template variable of that name would clash.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
        "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
        "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
    }
)


def openai_conversation(messages: list[Any], images: list | None = None) -> list[dict]:
    """The conversation; with ``images`` (a model that takes them, a template that
    walks content parts), contents are lists of parts and image URLs go to ``images``."""
    conversation = []
    for position, message in enumerate(messages):
        where = f"messages.{position}"
        role = normalize_role(message.role, f"{where}.role")
        if images is None:
            content = content_text(message.content, f"{where}.content")
        else:
            content = content_with_images(message.content, f"{where}.content", images)
        turn: dict[str, Any] = {"role": role, "content": content}
        tool_calls = getattr(message, "tool_calls", None)
        if tool_calls:
            if role != "assistant":
                raise InvalidArgumentError("only assistant messages carry tool_calls", param=f"{where}.tool_calls")
            turn["tool_calls"] = [_tool_call(call, f"{where}.tool_calls.{i}") for i, call in enumerate(tool_calls)]
        if role == "tool":
            call_id = getattr(message, "tool_call_id", None)
            if not isinstance(call_id, str):
                raise InvalidArgumentError("a tool message needs the tool_call_id it answers", param=f"{where}.tool_call_id")
            turn["tool_call_id"] = call_id
        if getattr(message, "name", None):
            turn["name"] = message.name
        reasoning = getattr(message, "reasoning_content", None)
        if reasoning and role == "assistant":
            turn["reasoning_content"] = reasoning
        conversation.append(turn)
    return conversation


def _tool_call(call: Any, where: str) -> dict:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise InvalidArgumentError("a tool call is {'id', 'type': 'function', 'function': {'name', 'arguments'}}", param=where)
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except (ValueError, RecursionError):
            raise InvalidArgumentError("tool call arguments must be JSON", param=f"{where}.function.arguments") from None
    return {"id": call.get("id"), "type": "function", "function": {"name": function["name"], "arguments": arguments}}


def template_kwargs(kwargs: dict | None, param: str = "chat_template_kwargs") -> dict:
    if not kwargs:
        return {}
    if not isinstance(kwargs, dict):
        raise InvalidArgumentError(f"{param} must be an object", param=param)
    reserved = sorted(RESERVED_TEMPLATE_KWARGS.intersection(kwargs))
    if reserved:
        raise InvalidArgumentError(f"{param} may not set {', '.join(reserved)}", param=param)
    return dict(kwargs)
