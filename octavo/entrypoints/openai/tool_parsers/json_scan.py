"""Reading JSON that is still arriving: where values end, and the top-level
members of an object, without waiting for the whole text.

The functions re-scan from the start each time (tool calls are short), and
never guess: a value whose end has not arrived yet has ``end=None``, and the
text seen of it so far is always a prefix of its final text.
"""

from __future__ import annotations

from dataclasses import dataclass

_WHITESPACE = " \t\r\n"


def skip_whitespace(text: str, position: int) -> int:
    while position < len(text) and text[position] in _WHITESPACE:
        position += 1
    return position


def value_end(text: str, start: int) -> int | None:
    """Index just past the JSON value starting at ``start`` (None: not complete yet)."""
    if start >= len(text):
        return None
    first = text[start]
    if first == '"':
        return _string_end(text, start)
    if first in "{[":
        return _container_end(text, start)
    # A number or literal ends at a delimiter (which must have arrived).
    position = start
    while position < len(text) and text[position] not in ",}]" + _WHITESPACE:
        position += 1
    return position if position < len(text) else None


def _string_end(text: str, start: int) -> int | None:
    position = start + 1
    while position < len(text):
        char = text[position]
        if char == "\\":
            position += 2
            continue
        if char == '"':
            return position + 1
        position += 1
    return None


def _container_end(text: str, start: int) -> int | None:
    depth = 0
    position = start
    while position < len(text):
        char = text[position]
        if char == '"':
            end = _string_end(text, position)
            if end is None:
                return None
            position = end
            continue
        if char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return position + 1
        position += 1
    return None


@dataclass
class Member:
    key: str
    value_start: int
    value_end: int | None  # None while the value is still arriving


def object_members(text: str, start: int) -> tuple[list[Member], int | None]:
    """The members seen so far of the object at ``text[start] == "{"``, and the
    index past its closing brace (None while it is open)."""
    import json

    members: list[Member] = []
    position = skip_whitespace(text, start + 1)
    while position < len(text):
        if text[position] == "}":
            return members, position + 1
        if text[position] == ",":
            position = skip_whitespace(text, position + 1)
            continue
        key_end = _string_end(text, position) if text[position] == '"' else None
        if key_end is None:
            return members, None
        colon = skip_whitespace(text, key_end)
        if colon >= len(text) or text[colon] != ":":
            return members, None
        value_start = skip_whitespace(text, colon + 1)
        if value_start >= len(text):
            return members, None
        end = value_end(text, value_start)
        members.append(Member(json.loads(text[position:key_end]), value_start, end))
        if end is None:
            return members, None
        position = skip_whitespace(text, end)
    return members, None
