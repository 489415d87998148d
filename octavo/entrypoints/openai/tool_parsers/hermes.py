"""Hermes / Qwen format: each call is ``<tool_call>{"name": ..., "arguments":
{...}}</tool_call>`` between (or after) plain text.

A block whose inside is not a call object is passed on as text; a block left
open when the output ends keeps whatever call it started (its arguments may
then be incomplete, as the output is).
"""

from __future__ import annotations

from octavo.entrypoints.openai.tool_parsers.base import CallObject, ParsedDelta, ToolParser, read_until
from octavo.entrypoints.openai.tool_parsers.json_scan import skip_whitespace

START, END = "<tool_call>", "</tool_call>"


class HermesToolParser(ToolParser):
    def __init__(self) -> None:
        super().__init__()
        self.position = 0  # text before it is decided
        self.block_start: int | None = None  # where the open block's "<tool_call>" is
        self.call: CallObject | None = None

    def _advance(self, final: bool) -> ParsedDelta:
        out = ParsedDelta()
        while True:
            if self.block_start is None:
                if not self._content(out, final):
                    return out
            elif not self._block(out, final):
                return out

    def _content(self, out: ParsedDelta, final: bool) -> bool:
        content, stop, found = read_until(self.text, self.position, START, final)
        out.content += content
        if not found:
            self.position = stop
            return False
        self.block_start, self.position = stop, stop + len(START)
        self.call = CallObject(self.num_calls)
        return True

    def _block(self, out: ParsedDelta, final: bool) -> bool:
        text, call = self.text, self.call
        start = skip_whitespace(text, self.position)
        end = call.advance(text, start, out) if start < len(text) and text[start] == "{" else None
        if not call.started:
            # Not (yet) a call: text, once the block closes or the output ends.
            close = text.find(END, self.position)
            if close < 0 and not final:
                return False
            stop = close + len(END) if close >= 0 else len(text)
            out.content += text[self.block_start : stop]
            return self._close(stop)
        if end is None:  # the call's object is still arriving
            if final:
                return self._close(len(text))
            return False
        after = skip_whitespace(text, end)
        if text.startswith(END, after):
            return self._close(after + len(END))
        if END.startswith(text[after:]):  # nothing, or part of the end tag, so far
            return self._close(len(text)) if final else False
        return self._close(after)  # no end tag: the call is whole anyway

    def _close(self, position: int) -> bool:
        if self.call.started:
            self.num_calls += 1
        self.block_start, self.call, self.position = None, None, position
        return True
