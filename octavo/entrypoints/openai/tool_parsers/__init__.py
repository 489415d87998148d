"""Tool-call parsers by name (vLLM's ``--tool-call-parser`` names)."""

from __future__ import annotations

from collections.abc import Callable

from octavo.entrypoints.openai.tool_parsers.base import ParsedDelta, ToolCallDelta, ToolParser
from octavo.entrypoints.openai.tool_parsers.hermes import HermesToolParser
from octavo.entrypoints.openai.tool_parsers.llama3_json import Llama3JsonToolParser
from octavo.entrypoints.openai.tool_parsers.mistral import MistralToolParser

TOOL_PARSERS: dict[str, Callable[[], ToolParser]] = {
    "hermes": HermesToolParser,
    "qwen": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
}

__all__ = ["TOOL_PARSERS", "ParsedDelta", "ToolCallDelta", "ToolParser"]
