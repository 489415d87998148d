"""Anthropic messages -> the conversation a chat template renders, and the
request's tools and thinking switch -> ``ChatFeatures``.

Content blocks: ``text``; an assistant's ``tool_use`` (a tool call whose
``input`` is the arguments object) and ``thinking`` (its reasoning); a user's
``tool_result`` (a ``tool`` turn before the user's text, ``is_error`` shown
as an ``Error:`` prefix). ``redacted_thinking`` is opaque, so there is
nothing to render. A user's ``image`` (a base64 source) where the model takes
images: the turn's content becomes the parts vision templates walk. Other
blocks (documents, server tools) are a 400.

``tool_choice``: ``auto``, ``any`` (= OpenAI's ``required``), ``tool`` (a
named function), ``none``; ``disable_parallel_tool_use`` allows one call.
``thinking``: ``enabled`` needs a ``--reasoning-parser`` and sets the
template's ``enable_thinking``; ``disabled`` clears it. ``budget_tokens``
is not enforced (``max_tokens`` bounds the whole output).
"""

from __future__ import annotations

from typing import Any

from octavo.entrypoints.openai.chat_features import ChatFeatures, features_for
from octavo.entrypoints.openai.chat_template import content_text, text_parts
from octavo.entrypoints.openai.config import ServerConfig
from octavo.entrypoints.openai.structured import constraint_from_request
from octavo.entrypoints.openai.tools import Tool, ToolUse, make_tool, resolve_tool_choice
from octavo.errors import InvalidArgumentError


def anthropic_conversation(body: Any, images: list | None = None) -> list[dict]:
    """The conversation; with ``images`` (a model that takes them, a template that walks
    content parts), contents are lists of parts and image sources go to ``images``."""
    as_parts = text_parts if images is not None else (lambda text: text)  # noqa: E731
    conversation: list[dict] = []
    if body.system:
        conversation.append({"role": "system", "content": as_parts(content_text(body.system, "system"))})
    for position, message in enumerate(body.messages):
        where = f"messages.{position}.content"
        if isinstance(message.content, str):
            conversation.append({"role": message.role, "content": as_parts(message.content)})
            continue
        turn: dict[str, Any] = {"role": message.role, "content": ""}
        texts, calls, parts = [], [], []
        for index, block in enumerate(message.content):
            kind, place = block.type, f"{where}.{index}"
            if kind == "text":
                texts.append(block.text or "")
                parts.append({"type": "text", "text": block.text or ""})
            elif kind == "image" and message.role == "user" and images is not None:
                images.append(_image_source(block.source, place))
                parts.append({"type": "image"})
            elif kind == "tool_use" and message.role == "assistant":
                if not block.id or not block.name:
                    raise InvalidArgumentError("a tool_use block needs an id and a name", param=place)
                calls.append({"id": block.id, "type": "function", "function": {"name": block.name, "arguments": block.input or {}}})
            elif kind == "tool_result" and message.role == "user":
                result = content_text(block.content, f"{place}.content")
                conversation.append(
                    {"role": "tool", "tool_call_id": block.tool_use_id, "content": f"Error: {result}" if block.is_error else result}
                )
            elif kind == "thinking" and message.role == "assistant":
                turn["reasoning_content"] = turn.get("reasoning_content", "") + (block.thinking or "")
            elif kind == "redacted_thinking" and message.role == "assistant":
                continue
            else:
                raise InvalidArgumentError(f"{kind!r} blocks are not supported in {message.role} messages", param=place)
        turn["content"] = parts if images is not None else "\n".join(texts)
        if calls:
            turn["tool_calls"] = calls
        if parts or calls or len(turn) > 2 or not any(b.type == "tool_result" for b in message.content):
            conversation.append(turn)
    return conversation


def _image_source(source: Any, place: str) -> str:
    """An image block's source as the image loader takes it (a data URL; a URL is refused there)."""
    if isinstance(source, dict) and source.get("type") == "base64" and isinstance(source.get("data"), str):
        media_type = source.get("media_type") or "image/png"
        return f"data:{media_type};base64,{source['data']}"
    if isinstance(source, dict) and source.get("type") == "url" and isinstance(source.get("url"), str):
        return source["url"]
    raise InvalidArgumentError("an image block's source is {'type': 'base64', 'media_type', 'data'}", param=f"{place}.source")


_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def anthropic_tools(body: Any) -> list[Tool]:
    tools = []
    for index, raw in enumerate(body.tools or []):
        if not isinstance(raw, dict) or raw.get("type", "custom") != "custom":
            kind = raw.get("type") if isinstance(raw, dict) else type(raw).__name__
            raise InvalidArgumentError(f"server tools ({kind!r}) are not supported", param=f"tools.{index}")
        tools.append(make_tool(raw.get("name"), raw.get("description"), raw.get("input_schema"), f"tools.{index}"))
    return tools


def prompt_features(config: ServerConfig, body: Any) -> ChatFeatures:
    """What shapes the prompt alone (count_tokens): the tools and the thinking switch."""
    return features_for(config, ToolUse(tools=anthropic_tools(body)), None, None, _thinking_kwargs(config, body.thinking))


def anthropic_features(config: ServerConfig, body: Any) -> ChatFeatures:
    tools = anthropic_tools(body)
    choice, parallel = None, True
    if body.tool_choice is not None:
        kind = body.tool_choice.get("type")
        if kind == "tool":
            choice = {"type": "function", "function": {"name": body.tool_choice.get("name")}}
        elif kind in _TOOL_CHOICES:
            choice = _TOOL_CHOICES[kind]
        else:
            raise InvalidArgumentError(f"tool_choice type must be auto, any, tool or none, got {kind!r}", param="tool_choice")
        parallel = not body.tool_choice.get("disable_parallel_tool_use", False)
    auto_enabled = config.enable_auto_tool_choice and config.tool_call_parser is not None
    use = resolve_tool_choice(tools, choice, parallel, auto_enabled)
    constraint, param = constraint_from_request(body)
    return features_for(config, use, constraint, param, _thinking_kwargs(config, body.thinking))


def _thinking_kwargs(config: ServerConfig, thinking: dict | None) -> dict:
    if thinking is None:
        return {}
    kind = thinking.get("type")
    if kind == "disabled":
        return {"enable_thinking": False}
    if kind == "enabled":
        if config.reasoning_parser is None:
            raise InvalidArgumentError("thinking needs the server started with --reasoning-parser", param="thinking")
        return {"enable_thinking": True}
    raise InvalidArgumentError(f"thinking type must be enabled or disabled, got {kind!r}", param="thinking.type")
