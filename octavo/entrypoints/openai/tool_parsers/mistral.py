"""Mistral format: text, then ``[TOOL_CALLS]`` and the calls: a JSON array of
``{"name": ..., "arguments": {...}}`` objects (the older tokenizers), or
``name[ARGS]{...}`` after each ``[TOOL_CALLS]`` (tokenizer v11 and later)."""

from __future__ import annotations

from octavo.entrypoints.openai.tool_parsers.base import (
    CallSequenceParser,
    ParsedDelta,
    ToolCallDelta,
    new_call_id,
    read_until,
)
from octavo.entrypoints.openai.tool_parsers.json_scan import skip_whitespace, value_end

MARKER, ARGS = "[TOOL_CALLS]", "[ARGS]"


class MistralToolParser(CallSequenceParser):
    needs_special_tokens = True  # [TOOL_CALLS] and [ARGS] are special tokens

    def __init__(self) -> None:
        super().__init__()
        self.named_format: bool | None = None  # name[ARGS]{...} calls (decided at the first one)
        self.arguments: tuple[int, int] | None = None  # open named call: (arguments start, characters sent)

    def _advance(self, final: bool) -> ParsedDelta:
        out = ParsedDelta()
        text = self.text
        if not self.in_calls:
            content, stop, found = read_until(text, self.position, MARKER, final)
            out.content += content
            if not found:
                self.position = stop
                return out
            self.in_calls, self.position = True, stop + len(MARKER)
        if self.named_format is None:
            start = skip_whitespace(text, self.position)
            if start >= len(text):
                return out
            self.named_format = text[start] not in "[{"
        if self.named_format:
            self._read_named(out, final)
        else:
            self._read_calls(out, final)
        return out

    def _read_named(self, out: ParsedDelta, final: bool) -> None:
        text = self.text
        while not self.trailing:
            if self.arguments is None:
                start = skip_whitespace(text, self.position)
                if text.startswith(MARKER, start):  # the next call's marker
                    self.position = start + len(MARKER)
                    continue
                split = text.find(ARGS, start)
                if split < 0:  # the name is still arriving
                    if final:
                        out.content += text[start:]
                        self.position = len(text)
                    return
                out.tool_calls.append(ToolCallDelta(self.num_calls, id=new_call_id(), name=text[start:split].strip()))
                self.arguments = (skip_whitespace(text, split + len(ARGS)), 0)
            if not self._send_arguments(out):
                return
        out.content += text[self.position :]
        self.position = len(text)

    def _send_arguments(self, out: ParsedDelta) -> bool:
        """Send what arrived of the open call's arguments; True once they are complete."""
        text = self.text
        start, num_sent = self.arguments
        end = value_end(text, start) if start < len(text) else None
        stop = end if end is not None else len(text)
        if stop > start + num_sent:
            out.tool_calls.append(ToolCallDelta(self.num_calls, arguments=text[start + num_sent : stop]))
            self.arguments = (start, stop - start)
        if end is None:
            return False
        self.num_calls += 1
        self.arguments, self.position = None, end
        after = skip_whitespace(text, end)
        if after < len(text) and not text.startswith(MARKER, after) and not MARKER.startswith(text[after:]):
            self.trailing, self.position = True, after
        return True
