"""Shaped choice output (``ChoiceDelta`` / ``ChoiceMessage``) -> Anthropic
content blocks: ``thinking``, ``text`` and ``tool_use``, in the order the
model wrote them.

Streaming: a block opens (``content_block_start``) when its first piece
arrives and closes when a block of another kind (or another tool call)
begins, or at the end; reasoning goes out as ``thinking_delta``, text as
``text_delta``, a tool call's arguments as ``input_json_delta`` pieces whose
``partial_json`` concatenate to the whole ``input`` object.
"""

from __future__ import annotations

import json

from octavo.core.outputs import CompletionOutput
from octavo.entrypoints.openai.chat_output import ChoiceDelta, ChoiceMessage, OutputShaper


def tool_use_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def _input(arguments: str) -> dict:
    try:
        value = json.loads(arguments or "{}")
    except (ValueError, RecursionError):  # cut off by max_tokens, or nested past any use
        return {}
    return value if isinstance(value, dict) else {}


def content_blocks(message: ChoiceMessage) -> list[dict]:
    blocks: list[dict] = []
    if message.reasoning:
        blocks.append({"type": "thinking", "thinking": message.reasoning, "signature": ""})
    if message.content or not message.tool_calls:
        blocks.append({"type": "text", "text": message.content})
    for call in message.tool_calls:
        blocks.append({"type": "tool_use", "id": tool_use_id(call.id), "name": call.name, "input": _input(call.arguments)})
    return blocks


def stop_info(completion: CompletionOutput, shaper: OutputShaper) -> tuple[str, str | None]:
    if completion.finish_reason == "length":
        return "max_tokens", None
    if isinstance(completion.stop_reason, str):
        return "stop_sequence", completion.stop_reason
    if shaper.num_tool_calls:
        return "tool_use", None
    return "end_turn", None


class BlockStream:
    """Deltas -> ``(event, payload)`` pairs of content-block events."""

    def __init__(self) -> None:
        self.index = -1
        self.open: tuple[str, int | None] | None = None  # (block kind, tool call index)

    def events(self, delta: ChoiceDelta) -> list[tuple[str, dict]]:
        events: list[tuple[str, dict]] = []
        if delta.reasoning:
            self._ensure(("thinking", None), {"type": "thinking", "thinking": "", "signature": ""}, events)
            events.append(self._delta({"type": "thinking_delta", "thinking": delta.reasoning}))
        if delta.content:
            self._ensure(("text", None), {"type": "text", "text": ""}, events)
            events.append(self._delta({"type": "text_delta", "text": delta.content}))
        for call in delta.tool_calls:
            if call.id is not None:
                block = {"type": "tool_use", "id": tool_use_id(call.id), "name": call.name, "input": {}}
                self._ensure(("tool_use", call.index), block, events)
            if call.arguments and self.open == ("tool_use", call.index):
                events.append(self._delta({"type": "input_json_delta", "partial_json": call.arguments}))
        return events

    def close(self) -> list[tuple[str, dict]]:
        events: list[tuple[str, dict]] = []
        if self.index < 0:  # nothing was written: one empty text block
            self._ensure(("text", None), {"type": "text", "text": ""}, events)
        self._close(events)
        return events

    def _ensure(self, kind: tuple[str, int | None], block: dict, events: list) -> None:
        if self.open == kind:
            return
        self._close(events)
        self.index += 1
        self.open = kind
        events.append(("content_block_start", {"type": "content_block_start", "index": self.index, "content_block": block}))

    def _close(self, events: list) -> None:
        if self.open is not None:
            events.append(("content_block_stop", {"type": "content_block_stop", "index": self.index}))
            self.open = None

    def _delta(self, delta: dict) -> tuple[str, dict]:
        return "content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta}
