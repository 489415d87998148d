"""Tools on a chat request: which ones, and how the output may call them.

``tool_choice`` (OpenAI's names; the Anthropic route maps its own onto them):
- ``none``: the tools still reach the chat template; the output is text.
- ``auto`` (the default with tools): the model decides; its output is read
  by the server's ``--tool-call-parser``, which ``--enable-auto-tool-choice``
  must have switched on (as in vLLM).
- ``required`` / a named function: the output is constrained by a grammar to
  a JSON array of ``{"name", "parameters"}`` calls (one call when
  ``parallel_tool_calls`` is false) or to the named function's arguments, so
  the arguments always parse and match the tool's JSON schema. No parser is
  involved; the server reads that JSON itself (``chat_output.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from octavo.core.structured_output.params import StructuredOutputsParams
from octavo.core.structured_output.schema_check import check_json_schema
from octavo.errors import InvalidArgumentError, StructuredOutputError

_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
# A tool without parameters takes an empty object.
NO_PARAMETERS = {"type": "object", "properties": {}}


@dataclass
class Tool:
    name: str
    description: str | None
    parameters: dict
    where: str = "tools"  # the request field it came from, for error messages

    def checked_parameters(self) -> dict:
        """The parameters schema, refused (400) if a grammar could not enforce it."""
        try:
            check_json_schema(self.parameters)
        except StructuredOutputError as exc:
            raise StructuredOutputError(f"tool {self.name!r}: {exc.message}", param=f"{self.where}.parameters") from None
        return self.parameters

    def for_template(self) -> dict:
        """The OpenAI shape chat templates expect."""
        function = {"name": self.name, "parameters": self.parameters}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}


@dataclass
class ToolUse:
    """What the request lets the output do with its tools."""

    tools: list[Tool] = field(default_factory=list)
    mode: str = "none"  # none, auto, required, named
    name: str | None = None  # the named function
    parallel: bool = True

    @property
    def template_tools(self) -> list[dict] | None:
        return [tool.for_template() for tool in self.tools] or None

    def constraint(self) -> StructuredOutputsParams | None:
        """The grammar that enforces ``required`` and named choices."""
        if self.mode == "named":
            tool = next(t for t in self.tools if t.name == self.name)
            return StructuredOutputsParams(json=tool.checked_parameters())
        if self.mode != "required":
            return None
        definitions: dict = {}
        calls = [
            {
                "type": "object",
                "properties": {
                    "name": {"const": tool.name},
                    "parameters": _embed(tool.checked_parameters(), f"t{i}_", definitions),
                },
                "required": ["name", "parameters"],
            }
            for i, tool in enumerate(self.tools)
        ]
        array: dict = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
        if not self.parallel:
            array["maxItems"] = 1
        if definitions:
            array["$defs"] = definitions
        return StructuredOutputsParams(json=array)


def _embed(schema: dict, prefix: str, definitions: dict) -> dict:
    """``schema`` moved under another root: its ``$defs`` (and ``definitions``)
    join ``definitions`` under ``prefix``ed names, and its local references
    follow them (a reference to its own root points at a copy of it)."""
    import copy

    schema = copy.deepcopy(schema)
    renames = {}
    for section in ("$defs", "definitions"):
        for key, sub in (schema.pop(section, None) or {}).items():
            renames[f"#/{section}/{key}"] = f"#/$defs/{prefix}{key}"
            definitions[f"{prefix}{key}"] = sub
    renames["#"] = f"#/$defs/{prefix}root"

    def rewrite(node: Any) -> None:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                base = next((old for old in renames if ref == old or ref.startswith(old + "/")), None)
                if base is not None:
                    node["$ref"] = renames[base] + ref[len(base):]
            for value in node.values():
                rewrite(value)
        elif isinstance(node, list):
            for value in node:
                rewrite(value)

    rewrite(schema)
    for key in [k for k in definitions if k.startswith(prefix)]:
        rewrite(definitions[key])
    if any(isinstance(v, str) and v.startswith(f"#/$defs/{prefix}root") for v in _refs(schema, definitions)):
        definitions[f"{prefix}root"] = schema
    return schema


def _refs(*nodes: Any):
    for node in nodes:
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                yield node["$ref"]
            yield from _refs(*node.values())
        elif isinstance(node, list):
            yield from _refs(*node)


def parse_tools(raw_tools: list[Any] | None, param: str = "tools") -> list[Tool]:
    tools = []
    for position, raw in enumerate(raw_tools or []):
        where = f"{param}.{position}"
        if not isinstance(raw, dict) or raw.get("type", "function") != "function" or not isinstance(raw.get("function"), dict):
            raise InvalidArgumentError("each tool must be {'type': 'function', 'function': {...}}", param=where)
        function = raw["function"]
        tools.append(make_tool(function.get("name"), function.get("description"), function.get("parameters"), where))
    names = [tool.name for tool in tools]
    duplicate = next((name for name in names if names.count(name) > 1), None)
    if duplicate is not None:
        raise InvalidArgumentError(f"two tools are named {duplicate!r}", param=param)
    return tools


def make_tool(name: Any, description: Any, parameters: Any, where: str) -> Tool:
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidArgumentError(
            f"a tool name must be 1-64 letters, digits, '_', '-', '.' or ':', got {name!r}", param=f"{where}.name"
        )
    if description is not None and not isinstance(description, str):
        raise InvalidArgumentError("a tool description must be a string", param=f"{where}.description")
    if parameters is None:
        parameters = NO_PARAMETERS
    if not isinstance(parameters, dict):
        raise InvalidArgumentError("a tool's parameters must be a JSON schema object", param=f"{where}.parameters")
    # Checked for what a grammar can enforce only where one will (required and named choices).
    return Tool(name, description, parameters, where)


def resolve_tool_choice(
    tools: list[Tool], choice: Any, parallel: bool | None, auto_enabled: bool, param: str = "tool_choice"
) -> ToolUse:
    """``choice`` is None (the default), "none", "auto", "required" or
    ``{"type": "function", "function": {"name": ...}}``."""
    if choice is None:
        choice = "auto" if tools else "none"
    use = ToolUse(tools=tools, parallel=parallel is not False)
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if not isinstance(name, str):
            raise InvalidArgumentError("a named tool_choice is {'type': 'function', 'function': {'name': ...}}", param=param)
        use.mode, use.name = "named", name
    elif choice in ("none", "auto", "required"):
        use.mode = choice
    else:
        raise InvalidArgumentError(f"tool_choice must be none, auto, required or a function, got {choice!r}", param=param)
    if use.mode != "none" and not tools:
        raise InvalidArgumentError(f"tool_choice {use.mode!r} needs tools", param=param)
    if use.mode == "named" and use.name not in {tool.name for tool in tools}:
        raise InvalidArgumentError(f"tool_choice names {use.name!r}, which is not among the tools", param=param)
    if use.mode == "auto" and not auto_enabled:
        raise InvalidArgumentError(
            "tool_choice 'auto' needs the server started with --enable-auto-tool-choice and --tool-call-parser "
            "(or send tool_choice 'required', 'none' or a named function)",
            param=param,
        )
    return use
