"""Shaped output (``ChoiceDelta``s, from the chat routes' ``OutputShaper``) ->
Responses output items: ``reasoning`` (its text as ``reasoning_text``
content), ``message`` (one ``output_text`` part) and ``function_call``, in
the order the model wrote them, with the stream events that build them.

An item opens (``response.output_item.added``, and for reasoning and
messages ``response.content_part.added``) when its first piece arrives, grows
by ``*.delta`` events, and closes (``*.done``, ``response.content_part.done``,
``response.output_item.done``) when an item of another kind, or another
call, begins, or at the end. A whole answer is built by the same machine from
one delta, so a streamed and a non-streamed answer hold the same items.

Logprobs (when asked) ride on the message's text: each text delta carries
those of the tokens generated since the previous one, and the part holds them
all.
"""

from __future__ import annotations

import uuid
from typing import Any

from octavo.entrypoints.openai.chat_output import ChoiceDelta


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ItemStream:
    def __init__(self, with_logprobs: bool = False, max_tool_calls: int | None = None) -> None:
        self.items: list[dict] = []
        self.open: tuple[str, int | None] | None = None  # (item kind, tool call index)
        self.with_logprobs = with_logprobs
        self.max_tool_calls = max_tool_calls
        self.pending_logprobs: list[dict] = []
        self.num_calls = 0

    @property
    def index(self) -> int:
        return len(self.items) - 1

    def events(self, delta: ChoiceDelta, logprobs: list[dict] | None = None) -> list[dict]:
        events: list[dict] = []
        self.pending_logprobs.extend(logprobs or [])
        if delta.reasoning:
            self._ensure(("reasoning", None), events)
            self.items[-1]["content"][0]["text"] += delta.reasoning
            events.append(self._part_event("response.reasoning_text.delta", delta=delta.reasoning))
        if delta.content:
            self._ensure(("message", None), events)
            part = self.items[-1]["content"][0]
            part["text"] += delta.content
            event = self._part_event("response.output_text.delta", delta=delta.content, logprobs=self.pending_logprobs)
            if self.with_logprobs:
                part["logprobs"].extend(self.pending_logprobs)
            self.pending_logprobs = []
            events.append(event)
        for call in delta.tool_calls:
            if self.max_tool_calls is not None and call.index >= self.max_tool_calls:
                continue
            if call.id is not None:
                self._ensure(("function_call", call.index), events, call_id=call.id, name=call.name or "")
            if call.arguments and self.open == ("function_call", call.index):
                self.items[-1]["arguments"] += call.arguments
                events.append(self._item_event("response.function_call_arguments.delta", delta=call.arguments))
        return events

    def close(self, status: str) -> list[dict]:
        """The end of the answer: the open item closes with ``status`` (``incomplete``: cut by the token limit)."""
        events: list[dict] = []
        if not self.items:  # nothing was written: one empty message
            self._ensure(("message", None), events)
        if self.with_logprobs and self.open == ("message", None):
            self.items[-1]["content"][0]["logprobs"].extend(self.pending_logprobs)
            self.pending_logprobs = []
        self._close(events, status)
        return events

    # ------------------------------------------------------------------ items

    def _ensure(self, kind: tuple[str, int | None], events: list[dict], **call: str) -> None:
        if self.open == kind:
            return
        self._close(events, "completed")
        self.open = kind
        self.items.append(self._new_item(kind[0], **call))
        events.append({"type": "response.output_item.added", "output_index": self.index, "item": _copy(self.items[-1])})
        if kind[0] != "function_call":
            part = _copy_part(self.items[-1]["content"][0])
            events.append(self._part_event("response.content_part.added", part=part))

    def _new_item(self, kind: str, call_id: str = "", name: str = "") -> dict:
        if kind == "reasoning":
            return {"type": "reasoning", "id": new_item_id("rs"), "summary": [],
                    "content": [{"type": "reasoning_text", "text": ""}], "status": "in_progress"}
        if kind == "message":
            part: dict[str, Any] = {"type": "output_text", "text": "", "annotations": []}
            if self.with_logprobs:
                part["logprobs"] = []
            return {"type": "message", "id": new_item_id("msg"), "status": "in_progress", "role": "assistant",
                    "content": [part]}
        self.num_calls += 1
        return {"type": "function_call", "id": new_item_id("fc"), "call_id": call_id, "name": name, "arguments": "",
                "status": "in_progress"}

    def _close(self, events: list[dict], status: str) -> None:
        if self.open is None:
            return
        item = self.items[-1]
        item["status"] = status
        kind = item["type"]
        if kind == "function_call":
            events.append(self._item_event("response.function_call_arguments.done", arguments=item["arguments"],
                                           name=item["name"]))
        else:
            part = item["content"][0]
            if kind == "message":
                events.append(self._part_event("response.output_text.done", text=part["text"],
                                               logprobs=part.get("logprobs", [])))
            else:
                events.append(self._part_event("response.reasoning_text.done", text=part["text"]))
            events.append(self._part_event("response.content_part.done", part=_copy_part(part)))
        events.append({"type": "response.output_item.done", "output_index": self.index, "item": _copy(item)})
        self.open = None

    def _item_event(self, kind: str, **fields: Any) -> dict:
        return {"type": kind, "item_id": self.items[-1]["id"], "output_index": self.index, **fields}

    def _part_event(self, kind: str, **fields: Any) -> dict:
        return self._item_event(kind, content_index=0, **fields)


def _copy_part(part: dict) -> dict:
    return {**part, "logprobs": list(part["logprobs"])} if "logprobs" in part else dict(part)


def _copy(item: dict) -> dict:
    """A snapshot for an event (the item itself goes on growing)."""
    if "content" not in item:
        return dict(item)
    return {**item, "content": [_copy_part(part) for part in item["content"]]}
