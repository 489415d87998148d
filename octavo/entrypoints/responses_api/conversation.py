"""Responses input items -> the conversation a chat template renders, and the
request's tools, tool choice and text format -> ``ChatFeatures``.

Items, in order: messages (``user``, ``system``/``developer``, ``assistant``;
text parts, and a user's ``input_image`` data URLs where the model takes
images: then every turn's content is the parts vision templates walk), an assistant's ``reasoning`` (its ``reasoning_text``
content or, failing that, its summary), ``function_call`` and
``function_call_output``. The assistant-side items of one answer (reasoning,
then a message, then calls, as ``output.py`` writes them) become one
assistant turn, so that a response's output sent back as input renders as
the model wrote it. ``instructions`` is a system message first.
"""

from __future__ import annotations

import json
from typing import Any

from octavo.core.structured_output.params import StructuredOutputsParams
from octavo.entrypoints.openai.chat_features import ChatFeatures, features_for
from octavo.entrypoints.openai.chat_template import content_with_images, normalize_role, text_parts
from octavo.entrypoints.openai.config import ServerConfig
from octavo.entrypoints.openai.structured import constraint_from_request
from octavo.entrypoints.openai.tools import Tool, make_tool, resolve_tool_choice
from octavo.entrypoints.responses_api.output import new_item_id
from octavo.errors import InvalidArgumentError, OctavoError

TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
ASSISTANT_ITEMS = frozenset({"reasoning", "function_call"})


def part_texts(content: Any, where: str) -> str:
    """A message's content: a string or text parts (images, files and audio are a 400)."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        text = part.get("text") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(text, str):
            raise InvalidArgumentError(f"only text content is supported, got a {kind!r} part", param=f"{where}.{index}")
        texts.append(text)
    return "\n".join(texts)


def user_parts(content: Any, where: str, images: list) -> list[dict]:
    """A user or system message's content as template parts, its ``input_image`` URLs appended to
    ``images`` (the chat route's rule, ``content_with_images``, on the Responses API's part names)."""
    if content is None or isinstance(content, str):
        return content_with_images(content, where, images)
    parts = []
    for index, part in enumerate(content):
        if isinstance(part, dict) and part.get("type") == "input_image":
            parts.append({"type": "image_url", "image_url": part.get("image_url")})
        else:
            parts.append({"type": "text", "text": part_texts([part], f"{where}.{index}")})
    return content_with_images(parts, where, images)


def _as_parts(content: Any) -> list[dict]:
    return text_parts(content) if content is None or isinstance(content, str) else content


class ConversationBuilder:
    """Items -> turns; ``turn`` is the assistant turn still open to more items of its answer.
    With ``images`` (a list to fill), user messages may show images."""

    def __init__(self, instructions: str | None, images: list | None = None) -> None:
        self.turns: list[dict] = [{"role": "system", "content": instructions}] if instructions else []
        self.turn: dict | None = None
        self.images = images

    def rendered_turns(self) -> list[dict]:
        """The turns as the template reads them: with images, every content a list of parts."""
        if self.images is None:
            return self.turns
        return [{**turn, "content": _as_parts(turn.get("content"))} for turn in self.turns]

    def add(self, item: dict, where: str) -> None:
        kind = item.get("type") or "message"
        if kind == "message":
            self._message(item, where)
        elif kind == "function_call":
            self._call(item, where)
        elif kind == "function_call_output":
            self.turn = None
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise InvalidArgumentError(
                    "a function_call_output needs the call_id it answers", param=f"{where}.call_id"
                )
            output = part_texts(item.get("output"), f"{where}.output")
            self.turns.append({"role": "tool", "tool_call_id": call_id, "content": output})
        elif kind == "reasoning":
            self._reasoning(item, where)
        elif kind == "item_reference":
            raise InvalidArgumentError(
                "item_reference is not supported: send the item, or previous_response_id", param=f"{where}.type"
            )
        else:
            raise InvalidArgumentError(f"input items of type {kind!r} are not supported", param=f"{where}.type")

    def _message(self, item: dict, where: str) -> None:
        role = item.get("role")
        if not isinstance(role, str):
            raise InvalidArgumentError("a message needs a role", param=f"{where}.role")
        role = normalize_role(role, f"{where}.role")
        if role == "tool":
            raise InvalidArgumentError("tool results are function_call_output items", param=f"{where}.role")
        if role != "assistant":
            self.turn = None
            content = item.get("content")
            if self.images is None:
                content = part_texts(content, f"{where}.content")
            else:
                content = user_parts(content, f"{where}.content", self.images)
            self.turns.append({"role": role, "content": content})
            return
        text = part_texts(item.get("content"), f"{where}.content")
        turn = self._assistant(open_to_text=True)
        turn["content"] = text

    def _call(self, item: dict, where: str) -> None:
        name, call_id, arguments = item.get("name"), item.get("call_id"), item.get("arguments") or "{}"
        if not isinstance(name, str) or not isinstance(call_id, str):
            raise InvalidArgumentError("a function_call needs a name and a call_id", param=where)
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            raise InvalidArgumentError("function_call arguments must be JSON", param=f"{where}.arguments") from None
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        self._assistant(open_to_text=False).setdefault("tool_calls", []).append(call)

    def _reasoning(self, item: dict, where: str) -> None:
        parts = item.get("content") or item.get("summary") or []
        text = "".join(p.get("text", "") for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
        if not text:  # opaque (encrypted) reasoning from another server: nothing to render
            return
        turn = self._assistant(open_to_text=True)
        if turn["content"] or "tool_calls" in turn:  # reasoning opens the next answer
            turn = self._new_assistant()
        turn["reasoning_content"] = turn.get("reasoning_content", "") + text

    def _assistant(self, open_to_text: bool) -> dict:
        """The open assistant turn, or a new one where text would follow what it already holds."""
        turn = self.turn
        if turn is None or (open_to_text and (turn["content"] or "tool_calls" in turn)):
            turn = self._new_assistant()
        return turn

    def _new_assistant(self) -> dict:
        self.turn = {"role": "assistant", "content": ""}
        self.turns.append(self.turn)
        return self.turn


def responses_conversation(instructions: str | None, items: list[dict], where: str = "input") -> list[dict]:
    builder = ConversationBuilder(instructions)
    for index, item in enumerate(items):
        builder.add(item, f"{where}.{index}")
    return builder.turns


ITEM_ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def request_items(body: Any) -> list[dict]:
    """The request's input as plain item dicts, each with an id, a message's text as parts (OpenAI's
    listed shape): what is stored, listed and replayed."""
    raw = [{"role": "user", "content": body.input}] if isinstance(body.input, str) else [
        item.model_dump(exclude_none=True) for item in body.input
    ]
    items = []
    for plain in raw:
        plain.setdefault("type", "message")
        plain.setdefault("id", new_item_id(ITEM_ID_PREFIXES.get(plain["type"], "item")))
        if plain["type"] == "message" and isinstance(plain.get("content"), str):
            kind = "output_text" if plain.get("role") == "assistant" else "input_text"
            plain["content"] = [{"type": kind, "text": plain["content"]}]
        items.append(plain)
    return items


# ------------------------------------------------------------------ features


def responses_tools(raw_tools: list[Any] | None) -> list[Tool]:
    """Function tools (flat: ``{"type": "function", "name", "description", "parameters"}``)."""
    tools = []
    for index, raw in enumerate(raw_tools or []):
        where = f"tools.{index}"
        kind = raw.get("type") if isinstance(raw, dict) else None
        if kind != "function":
            raise InvalidArgumentError(f"only function tools are supported, got {kind!r}", param=f"{where}.type")
        tools.append(make_tool(raw.get("name"), raw.get("description"), raw.get("parameters"), where))
    names = [tool.name for tool in tools]
    duplicate = next((name for name in names if names.count(name) > 1), None)
    if duplicate is not None:
        raise InvalidArgumentError(f"two tools are named {duplicate!r}", param="tools")
    return tools


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            raise InvalidArgumentError(
                f"tool_choice type {choice.get('type')!r} is not supported (none, auto, required, a function)",
                param="tool_choice",
            )
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def text_format_constraint(body: Any) -> tuple[StructuredOutputsParams | None, str | None]:
    """``text.format`` (text, json_object, json_schema), or vLLM's constraint fields; not both."""
    fmt = body.text.format if body.text is not None else None
    constraint, param = constraint_from_request(body)
    if fmt is None or fmt.type == "text":
        return constraint, param
    if constraint is not None:
        raise InvalidArgumentError(f"send one output constraint, not text.format and {param}", param=param)
    if fmt.type == "json_object":
        return StructuredOutputsParams(json_object=True), "text.format"
    if fmt.type != "json_schema":
        raise InvalidArgumentError(
            f"text.format type {fmt.type!r} is not supported (text, json_object, json_schema)", param="text.format.type"
        )
    if not isinstance(fmt.json_schema, dict):
        raise InvalidArgumentError("text.format json_schema needs schema (an object)", param="text.format.schema")
    try:
        return StructuredOutputsParams(json=fmt.json_schema), "text.format.schema"
    except OctavoError as exc:
        raise InvalidArgumentError(exc.message, param="text.format.schema") from None


def responses_features(config: ServerConfig, body: Any) -> ChatFeatures:
    tools = responses_tools(body.tools)
    auto_enabled = config.enable_auto_tool_choice and config.tool_call_parser is not None
    use = resolve_tool_choice(tools, _tool_choice(body.tool_choice), body.parallel_tool_calls, auto_enabled)
    constraint, param = text_format_constraint(body)
    return features_for(config, use, constraint, param, {})
