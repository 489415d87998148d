"""Tool-call parsers by name (vLLM's ``--tool-call-parser`` names). A parser
class with ``wants_tools`` is built with the request's tools (their schemas
type what it reads)."""

from __future__ import annotations

from collections.abc import Callable

from octavo.entrypoints.openai.tool_parsers.base import ParsedDelta, ToolCallDelta, ToolParser
from octavo.entrypoints.openai.tool_parsers.deepseek_v3 import DeepSeekV3ToolParser, KimiK2ToolParser
from octavo.entrypoints.openai.tool_parsers.glm45 import Glm45ToolParser
from octavo.entrypoints.openai.tool_parsers.harmony import HarmonyToolParser
from octavo.entrypoints.openai.tool_parsers.hermes import HermesToolParser
from octavo.entrypoints.openai.tool_parsers.llama3_json import Llama3JsonToolParser
from octavo.entrypoints.openai.tool_parsers.marked_array import GraniteToolParser, Phi4MiniJsonToolParser
from octavo.entrypoints.openai.tool_parsers.mistral import MistralToolParser
from octavo.entrypoints.openai.tool_parsers.olmo3 import Olmo3ToolParser
from octavo.entrypoints.openai.tool_parsers.pythonic import PythonicToolParser
from octavo.entrypoints.openai.tool_parsers.qwen3_coder import Qwen3CoderToolParser, SeedOssToolParser

TOOL_PARSERS: dict[str, Callable[[], ToolParser]] = {
    "hermes": HermesToolParser,
    "qwen": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
    "granite": GraniteToolParser,
    "phi4_mini_json": Phi4MiniJsonToolParser,
    "pythonic": PythonicToolParser,
    "llama4_pythonic": PythonicToolParser,
    "deepseek_v3": DeepSeekV3ToolParser,
    "deepseek_v31": DeepSeekV3ToolParser,
    "qwen3_coder": Qwen3CoderToolParser,
    "seed_oss": SeedOssToolParser,
    "olmo3": Olmo3ToolParser,
    "kimi_k2": KimiK2ToolParser,
    "glm45": Glm45ToolParser,
    "openai": HarmonyToolParser,
}

__all__ = ["TOOL_PARSERS", "ParsedDelta", "ToolCallDelta", "ToolParser"]
