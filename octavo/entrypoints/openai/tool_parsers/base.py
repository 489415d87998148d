"""Tool calls out of generated text, as the text streams in.

A ``ToolParser`` is fed the output text piece by piece (the whole text at once
for a non-streamed response: same code, same result) and returns, for each
piece, the content that is plain text and the tool-call deltas, shaped as
OpenAI streams them: a call's first delta carries its index, id and name,
later ones pieces of its ``arguments`` JSON (which concatenate to the whole).
Text that might still turn into a marker is held back until it is decided;
``finish()`` releases what is left when the output ends.

``CallObject`` reads one call written as a JSON object, ``{"name": ...,
"arguments" (or "parameters"): {...}}``, whatever the model format around it.
Its arguments stream as they arrive (``json_scan`` finds where they end);
arguments written as a JSON string are sent decoded, once complete.
"""

from __future__ import annotations

import json
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from octavo.entrypoints.openai.tool_parsers.json_scan import object_members

ARGUMENT_KEYS = ("arguments", "parameters")


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolCallDelta:
    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass
class ParsedDelta:
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def extend(self, other: ParsedDelta) -> ParsedDelta:
        self.content += other.content
        self.tool_calls.extend(other.tool_calls)
        return self


class CallObject:
    """One ``{"name": ..., "arguments": ...}`` object, read as it arrives."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.started = False  # the first delta (id and name) was sent
        self.num_sent = 0  # characters of the arguments' text sent so far
        self.invalid = False  # complete, but not a call (no string "name")

    def advance(self, text: str, start: int, out: ParsedDelta) -> int | None:
        """Add the new deltas of the object at ``text[start]`` to ``out``; the
        index past the object once it is complete."""
        try:
            members, end = object_members(text, start)
        except ValueError:
            self.invalid = True
            return None
        by_key = {member.key: member for member in members}
        if not self.started and not self._start(text, by_key.get("name"), out):
            self.invalid = end is not None
            return end
        arguments = next((by_key[key] for key in ARGUMENT_KEYS if key in by_key), None)
        if arguments is not None:
            self._send_arguments(text, arguments, out)
        elif end is not None and self.num_sent == 0:
            out.tool_calls.append(ToolCallDelta(self.index, arguments="{}"))
            self.num_sent = 2
        return end

    def _start(self, text: str, name, out: ParsedDelta) -> bool:
        if name is None or name.value_end is None:
            return False
        try:
            value = json.loads(text[name.value_start : name.value_end])
        except ValueError:
            value = None
        if not isinstance(value, str) or not value:
            return False
        self.started = True
        out.tool_calls.append(ToolCallDelta(self.index, id=new_call_id(), name=value))
        return True

    def _send_arguments(self, text: str, member, out: ParsedDelta) -> None:
        if text[member.value_start] == '"':  # arguments as a JSON string: decode when complete
            if member.value_end is not None and self.num_sent == 0:
                raw = text[member.value_start : member.value_end]
                decoded = json.loads(raw)
                out.tool_calls.append(ToolCallDelta(self.index, arguments=decoded or "{}"))
                self.num_sent = len(raw)
            return
        end = member.value_end if member.value_end is not None else len(text)
        piece = text[member.value_start + self.num_sent : end]
        if piece:
            out.tool_calls.append(ToolCallDelta(self.index, arguments=piece))
            self.num_sent += len(piece)


class ToolParser(ABC):
    """One choice's output, read for tool calls in one model's format."""

    # Its markers are special tokens: the output must keep special tokens.
    needs_special_tokens: bool = False

    def __init__(self) -> None:
        self.text = ""
        self.num_calls = 0

    def feed(self, delta: str) -> ParsedDelta:
        self.text += delta
        return self._advance(final=False)

    def finish(self) -> ParsedDelta:
        return self._advance(final=True)

    @abstractmethod
    def _advance(self, final: bool) -> ParsedDelta:
        """Everything that can be decided about ``self.text`` so far."""


def read_until(text: str, position: int, marker: str, final: bool) -> tuple[str, int, bool]:
    """Plain text from ``position`` up to ``marker``: ``(the text, where the
    marker (or the undecided tail) starts, whether the marker was found)``.
    Without the marker, a tail that may still become it is held back unless
    the output has ended."""
    found = text.find(marker, position)
    if found >= 0:
        return text[position:found], found, True
    stop = len(text) if final else held_back(text, position, marker)
    return text[position:stop], stop, False


def held_back(text: str, start: int, marker: str) -> int:
    """Where the undecided tail of ``text[start:]`` begins: the longest suffix
    that is a proper prefix of ``marker`` (it may yet become the marker)."""
    for length in range(min(len(marker) - 1, len(text) - start), 0, -1):
        if marker.startswith(text[len(text) - length :]):
            return len(text) - length
    return len(text)


class CallSequenceParser(ToolParser):
    """Formats whose calls are JSON objects one after another (in an array,
    or separated by ``;``): subclasses decide where the calls begin
    (``calls_from``), this reads them; text after the last call is content."""

    separators = ";,[]"

    def __init__(self) -> None:
        super().__init__()
        self.position = 0
        self.call: CallObject | None = None
        self.call_start = 0
        self.in_calls = False
        self.trailing = False  # past the calls: the rest is plain text

    def _read_calls(self, out: ParsedDelta, final: bool) -> None:
        from octavo.entrypoints.openai.tool_parsers.json_scan import skip_whitespace

        text = self.text
        while not self.trailing:
            if self.call is None:
                position = skip_whitespace(text, self.position)
                while position < len(text) and text[position] in self.separators:
                    position = skip_whitespace(text, position + 1)
                self.position = position
                if position >= len(text):
                    return
                if text[position] != "{":
                    self.trailing = True
                    break
                self.call, self.call_start = CallObject(self.num_calls), position
            end = self.call.advance(text, self.call_start, out)
            if end is None:
                if final and not self.call.started:
                    out.content += text[self.call_start :]
                    self.position = len(text)
                return
            if self.call.started:
                self.num_calls += 1
            else:
                out.content += text[self.call_start : end]
            self.call, self.position = None, end
        out.content += text[self.position :]
        self.position = len(text)
