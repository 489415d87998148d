"""Qwen3-Coder's XML format (vLLM's ``qwen3_coder``): text, then calls

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    ...
    </function>
    </tool_call>

A parameter's value is raw text, typed by the tool's JSON schema: strings
stay as written, integers, numbers and booleans are read as such, objects
and arrays as JSON (a value that does not read as its type stays a string).
A parameter a tool does not declare is read as JSON where it parses. Each
call is sent whole once its ``</function>`` arrives (or with what arrived
when the output ends); a block that is not a function call is text.

Seed-OSS (vLLM's ``seed_oss``) writes the same calls between
``<seed:tool_call>`` and ``</seed:tool_call>``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from octavo.entrypoints.openai.tool_parsers.base import ParsedDelta, ToolCallDelta, ToolParser, new_call_id, read_until

START, END = "<tool_call>", "</tool_call>"
FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)(?:</function>|$)", re.DOTALL)
PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?(?:</parameter>|(?=<parameter=)|$)", re.DOTALL)


class Qwen3CoderToolParser(ToolParser):
    wants_tools = True  # parameter values are typed by the tools' schemas
    start, end = START, END  # the block's tags (Seed-OSS writes its own)

    def __init__(self, tools: list[Any] | None = None) -> None:
        super().__init__()
        self.schemas = {tool.name: tool.parameters.get("properties", {}) for tool in tools or []}
        self.position = 0
        self.after_block = False

    def _advance(self, final: bool) -> ParsedDelta:
        out = ParsedDelta()
        text = self.text
        while True:
            if self.after_block:  # the newline the format puts after a block is not content
                if self.position >= len(text) and not final:
                    return out
                self.position += text.startswith("\n", self.position)
                self.after_block = False
            start_tag, end_tag = self.start, self.end
            content, stop, found = read_until(text, self.position, start_tag, final)
            out.content += content
            self.position = stop
            if not found:
                return out
            end = text.find(end_tag, stop)
            if end < 0 and not final:
                return out  # the block is still arriving
            block_end = end if end >= 0 else len(text)
            block = text[stop + len(start_tag):block_end]
            if not self._read_block(block, out):
                out.content += text[stop:block_end + (len(end_tag) if end >= 0 else 0)]
            self.position = block_end + len(end_tag) if end >= 0 else len(text)
            self.after_block = True

    def _read_block(self, block: str, out: ParsedDelta) -> bool:
        match = FUNCTION.match(block)
        if match is None:
            return False
        name = match.group(1).strip()
        properties = self.schemas.get(name, {})
        arguments = {key.strip(): typed(value, properties.get(key.strip()))
                     for key, value in PARAMETER.findall(match.group(2))}
        out.tool_calls.append(ToolCallDelta(self.num_calls, id=new_call_id(), name=name,
                                            arguments=json.dumps(arguments, ensure_ascii=False)))
        self.num_calls += 1
        return True


def typed(value: str, schema: Any) -> Any:
    """A parameter's text as its schema's type (as JSON where the tool does not say)."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if kind == "string":
        return value
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError):  # not JSON, or nested past what a parser can walk: the text
        return value
    if kind is None:
        return parsed
    expected = {"integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list, "null": type(None)}
    ok = isinstance(parsed, expected.get(kind, object)) and not (kind in ("integer", "number") and isinstance(parsed, bool))
    return parsed if ok else value


class SeedOssToolParser(Qwen3CoderToolParser):
    """Seed-OSS: Qwen3-Coder's calls between its own tags (single tokens of its vocabulary)."""

    start, end = "<seed:tool_call>", "</seed:tool_call>"
    needs_special_tokens = True
