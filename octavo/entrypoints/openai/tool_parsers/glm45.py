"""GLM-4.5 / 4.6's format (vLLM's ``glm45``): text, then calls

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Beijing</arg_value>
    <arg_key>days</arg_key>
    <arg_value>3</arg_value>
    </tool_call>

The function's name, then key-value pairs. A value is raw text typed by the
tool's JSON schema as Qwen3-Coder's are (its template writes strings as
they are and other values as JSON). Blocks arrive and are read as
Qwen3-Coder's (``qwen3_coder.py``); a block that is not a call is text.
"""

from __future__ import annotations

import json
import re

from octavo.entrypoints.openai.tool_parsers.base import ParsedDelta, ToolCallDelta, new_call_id
from octavo.entrypoints.openai.tool_parsers.qwen3_coder import Qwen3CoderToolParser, typed

NAME = re.compile(r"\s*([^\s<]+)")
ARGUMENT = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)(?:</arg_value>|$)", re.DOTALL)


class Glm45ToolParser(Qwen3CoderToolParser):
    needs_special_tokens = True  # its tags are single tokens of GLM-4.5's vocabulary

    def _read_block(self, block: str, out: ParsedDelta) -> bool:
        match = NAME.match(block)
        rest = block[match.end():].lstrip() if match else ""
        if match is None or (rest and not rest.startswith("<arg_key>")):
            return False
        name = match.group(1)
        properties = self.schemas.get(name, {})
        arguments = {key.strip(): typed(value, properties.get(key.strip())) for key, value in ARGUMENT.findall(rest)}
        out.tool_calls.append(ToolCallDelta(self.num_calls, id=new_call_id(), name=name,
                                            arguments=json.dumps(arguments, ensure_ascii=False)))
        self.num_calls += 1
        return True
