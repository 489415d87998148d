"""Reasoning parsers by name (vLLM's ``--reasoning-parser`` names)."""

from __future__ import annotations

from collections.abc import Callable

from octavo.entrypoints.openai.reasoning.base import (
    DeepSeekR1ReasoningParser,
    DeepSeekV3ReasoningParser,
    Glm45ReasoningParser,
    GraniteReasoningParser,
    MistralReasoningParser,
    Olmo3ReasoningParser,
    Qwen3ReasoningParser,
    ReasoningParser,
    SeedOssReasoningParser,
)
from octavo.entrypoints.openai.reasoning.harmony import HarmonyReasoningParser

REASONING_PARSERS: dict[str, Callable[[], ReasoningParser]] = {
    "qwen3": Qwen3ReasoningParser,
    "deepseek_r1": DeepSeekR1ReasoningParser,
    "mistral": MistralReasoningParser,
    "granite": GraniteReasoningParser,
    "openai_gptoss": HarmonyReasoningParser,
    "seed_oss": SeedOssReasoningParser,
    "olmo3": Olmo3ReasoningParser,
    "glm45": Glm45ReasoningParser,
    "deepseek_v3": DeepSeekV3ReasoningParser,
}



def reasoning_parser_class(name: str, template_kwargs: dict) -> type[ReasoningParser]:
    """The parser for one request: a hybrid model's depends on whether its template thinks."""
    parser = REASONING_PARSERS[name]
    for_request = getattr(parser, "for_request", None)
    return for_request(template_kwargs) if for_request is not None else parser


__all__ = ["REASONING_PARSERS", "ReasoningParser", "reasoning_parser_class"]
