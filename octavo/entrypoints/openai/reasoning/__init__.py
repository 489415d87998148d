"""Reasoning parsers by name (vLLM's ``--reasoning-parser`` names)."""

from __future__ import annotations

from collections.abc import Callable

from octavo.entrypoints.openai.reasoning.base import (
    DeepSeekR1ReasoningParser,
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
}

__all__ = ["REASONING_PARSERS", "ReasoningParser"]
