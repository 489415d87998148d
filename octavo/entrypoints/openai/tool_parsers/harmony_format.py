"""OpenAI's harmony format (gpt-oss), read from generated text as it streams in.

An answer is a sequence of messages, each ``<|start|>ROLE HEADER<|message|>BODY
END``. The header names a channel (``<|channel|>analysis``: reasoning;
``commentary``: tool calls and preambles; ``final``: the answer), may address a
recipient (``to=functions.NAME``, in the channel part or after the role) and
may give a content type (``<|constrain|>json``). END is ``<|end|>``,
``<|return|>`` (the answer is done) or ``<|call|>`` (a tool is called). The
generation prompt already opened the first message (``<|start|>assistant``),
so the output starts with its header.

The markers are special tokens: they reach the text only where the request
keeps special tokens, which the harmony parsers ask for. Output that does not
start like a header (a constraint that held from the first token, another
model) is read as one message without a channel: plain text.

``HarmonyReader`` turns the text into events (a message opens, a piece of its
body, it closes), each with the output text it consumed (``raw``), so that a
reader further down can be handed the messages it should see, markers and all.
Text that may still become a marker is held back until it is decided.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from octavo.entrypoints.openai.tool_parsers.base import held_back

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
END, RETURN, CALL = "<|end|>", "<|return|>", "<|call|>"
MESSAGE_ENDS = (END, RETURN, CALL)
# A body also ends where a new message starts without its end marker.
BODY_STOPS = (*MESSAGE_ENDS, START)
# What a header may begin with: the next message's start, or (first message,
# whose role the prompt wrote) its channel or a recipient after the role.
HEADER_OPENERS = (START, CHANNEL, "to=")
FUNCTIONS = "functions."

_CHANNEL = re.compile(r"<\|channel\|>\s*([^\s<]+)")
_RECIPIENT = re.compile(r"(?:^|[\s>])to=([^\s<]+)")


@dataclass(frozen=True)
class Header:
    channel: str | None = None
    recipient: str | None = None

    @property
    def function(self) -> str | None:
        """The function a tool-call message calls (``to=functions.NAME``)."""
        if self.recipient is not None and self.recipient.startswith(FUNCTIONS):
            return self.recipient[len(FUNCTIONS) :] or None
        return None

    @property
    def is_reasoning(self) -> bool:
        return self.channel == "analysis" and self.recipient is None

    @property
    def is_visible(self) -> bool:
        """Text for the user: the answer, a preamble (commentary without a recipient), plain text."""
        return self.recipient is None and self.channel != "analysis"


def parse_header(text: str) -> Header:
    channel = _CHANNEL.search(text)
    recipient = _RECIPIENT.search(text)
    return Header(channel.group(1) if channel else None, recipient.group(1) if recipient else None)


@dataclass
class Event:
    kind: Literal["open", "text", "close"]
    header: Header
    text: str = ""  # a piece of the body ("text" events)
    raw: str = ""  # the output text this event consumed, markers included


class HarmonyReader:
    """One choice's output, read message by message."""

    def __init__(self) -> None:
        self.text = ""
        self.position = 0
        self.header: Header | None = None  # the open message's; None between messages

    def read(self, text: str, final: bool) -> list[Event]:
        """The events of ``text``, the whole output so far (it only grows),
        past what earlier calls read; ``final``: the output is complete."""
        self.text += text[len(self.text) :]
        return self._advance(final)

    def _advance(self, final: bool) -> list[Event]:
        events: list[Event] = []
        while (self.header is not None or self._open(events, final)) and self._body(events, final):
            pass
        return events

    def _open(self, events: list[Event], final: bool) -> bool:
        """Read the next message's header; False while it has not arrived (or nothing is left)."""
        text = self.text
        stripped = text[self.position :].lstrip()
        if not stripped.startswith(HEADER_OPENERS):
            maybe_opener = any(opener.startswith(stripped) for opener in HEADER_OPENERS)
            if not stripped or (maybe_opener and not final):
                if final:
                    self.position = len(text)
                return False
            self.header = Header()  # not harmony: plain text until a marker
            events.append(Event("open", self.header))
            return True
        found = text.find(MESSAGE, self.position)
        if found < 0:
            if final:  # an unfinished header is markup, never text
                self.position = len(text)
            return False
        raw = text[self.position : found + len(MESSAGE)]
        self.header, self.position = parse_header(raw), found + len(MESSAGE)
        events.append(Event("open", self.header, raw=raw))
        return True

    def _body(self, events: list[Event], final: bool) -> bool:
        """Read the open message's body; True once it closed before the text's end."""
        header, text = self.header, self.text
        assert header is not None
        found = min(((at, marker) for marker in BODY_STOPS if (at := text.find(marker, self.position)) >= 0),
                    default=None)
        if found is None:
            stop = len(text) if final else min(held_back(text, self.position, marker) for marker in BODY_STOPS)
            if stop > self.position:
                piece = text[self.position : stop]
                events.append(Event("text", header, piece, piece))
            self.position = stop
            if final:
                events.append(Event("close", header))
                self.header = None
            return False
        at, marker = found
        if at > self.position:
            piece = text[self.position : at]
            events.append(Event("text", header, piece, piece))
        end_marker = marker if marker in MESSAGE_ENDS else ""  # a START belongs to the next header
        events.append(Event("close", header, raw=end_marker))
        self.position, self.header = at + len(end_marker), None
        return True
