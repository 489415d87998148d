"""Formats that write text, then a marker, then the calls as a JSON array of
``{"name": ..., "arguments": {...}}`` objects:

- ``granite`` (IBM Granite 3.x): ``<|tool_call|>[...]`` (a special token), or
  ``<tool_call>[...]`` as later templates write it;
- ``phi4_mini_json`` (Phi-4-mini): ``functools[...]``.

The calls stream as they arrive (``CallSequenceParser``); text after the
array is content.
"""

from __future__ import annotations

from octavo.entrypoints.openai.tool_parsers.base import CallSequenceParser, ParsedDelta, held_back


class MarkedArrayToolParser(CallSequenceParser):
    markers: tuple[str, ...] = ()

    def _advance(self, final: bool) -> ParsedDelta:
        out = ParsedDelta()
        if not self.in_calls:
            found = [(self.text.find(m, self.position), m) for m in self.markers]
            found = [(at, m) for at, m in found if at >= 0]
            if not found:
                stop = len(self.text) if final else min(held_back(self.text, self.position, m) for m in self.markers)
                out.content += self.text[self.position:stop]
                self.position = stop
                return out
            at, marker = min(found)
            out.content += self.text[self.position:at]
            self.in_calls, self.position = True, at + len(marker)
        self._read_calls(out, final)
        return out


class GraniteToolParser(MarkedArrayToolParser):
    needs_special_tokens = True  # <|tool_call|> is a special token
    markers = ("<|tool_call|>", "<tool_call>")


class Phi4MiniJsonToolParser(MarkedArrayToolParser):
    markers = ("functools",)
