"""Olmo 3's format (vLLM's ``olmo3``): text, then calls one per line between
``<function_calls>`` and ``</function_calls>``:

    <function_calls>
    get_weather(city="Paris", days=3)
    get_time(zone=null)
    </function_calls>

Each line is a Python call with keyword arguments whose values are literals
(JSON's ``null``, ``true`` and ``false`` too). Blocks arrive and are read as
Qwen3-Coder's (``qwen3_coder.py``): whole once they close (or when the
output ends); one whose lines are not all calls is text.
"""

from __future__ import annotations

from octavo.entrypoints.openai.tool_parsers.base import ParsedDelta, ToolCallDelta, new_call_id
from octavo.entrypoints.openai.tool_parsers.pythonic import _calls
from octavo.entrypoints.openai.tool_parsers.qwen3_coder import Qwen3CoderToolParser


class Olmo3ToolParser(Qwen3CoderToolParser):
    start, end = "<function_calls>", "</function_calls>"

    def _read_block(self, block: str, out: ParsedDelta) -> bool:
        lines = [line.strip() for line in block.splitlines() if line.strip()]
        calls = _calls("[" + ", ".join(lines) + "]", json_names=True) if lines else None
        if calls is None:
            return False
        for name, arguments in calls:
            out.tool_calls.append(ToolCallDelta(self.num_calls, id=new_call_id(), name=name, arguments=arguments))
            self.num_calls += 1
        return True
