"""Olmo 3's format (vLLM's ``olmo3``): text, then calls one per line between
``<function_calls>`` and ``</function_calls>``:

    <function_calls>
    get_weather(city="Paris", days=3)
    get_time(zone=null)
    </function_calls>

Each line is a Python call with keyword arguments whose values are literals
(JSON's ``null``, ``true`` and ``false`` too). A block is read whole once
it closes (or when the output ends); one whose lines are not all calls is
text.
"""

from __future__ import annotations

from octavo.entrypoints.openai.tool_parsers.base import ParsedDelta, ToolCallDelta, ToolParser, new_call_id, read_until
from octavo.entrypoints.openai.tool_parsers.pythonic import _calls

START, END = "<function_calls>", "</function_calls>"


class Olmo3ToolParser(ToolParser):
    def __init__(self) -> None:
        super().__init__()
        self.position = 0

    def _advance(self, final: bool) -> ParsedDelta:
        out = ParsedDelta()
        text = self.text
        while True:
            content, stop, found = read_until(text, self.position, START, final)
            out.content += content
            self.position = stop
            if not found:
                return out
            end = text.find(END, stop)
            if end < 0 and not final:
                return out  # the block is still arriving
            block_end = end if end >= 0 else len(text)
            lines = [line.strip() for line in text[stop + len(START):block_end].splitlines() if line.strip()]
            calls = _calls("[" + ", ".join(lines) + "]", json_names=True) if lines else None
            if calls is None:
                out.content += text[stop:block_end + (len(END) if end >= 0 else 0)]
            for name, arguments in calls or ():
                out.tool_calls.append(ToolCallDelta(self.num_calls, id=new_call_id(), name=name, arguments=arguments))
                self.num_calls += 1
            self.position = block_end + len(END) if end >= 0 else len(text)
