"""Reasoning out of generated text, as the text streams in: ``<think> ...
</think>`` becomes ``reasoning_content`` (chat) or a ``thinking`` block
(Anthropic); what follows is the answer.

Like the tool parsers, a parser is fed pieces of text (or the whole text
once) and returns, for each piece, ``(reasoning, content)``; text that may
still be part of a tag is held back. The answer's leading blank lines right
after ``</think>`` are dropped (templates put them there).
"""

from __future__ import annotations

from octavo.entrypoints.openai.tool_parsers.base import held_back

START, END = "<think>", "</think>"


class ReasoningParser:
    """``starts_in_reasoning``: the prompt opened the ``<think>`` block (the
    output begins with reasoning even without the tag). Otherwise reasoning
    happens only if the output starts with ``<think>``. ``starts`` and
    ``ends`` are the tags a model family writes (any of each)."""

    starts_in_reasoning = False
    starts: tuple[str, ...] = (START,)
    ends: tuple[str, ...] = (END,)
    needs_special_tokens = False  # its tags are special tokens: the output must keep them

    def __init__(self) -> None:
        self.text = ""
        self.position = 0
        self.mode = "start"  # start (undecided) -> reasoning -> content, or start -> content
        self.strip_blank = False

    def feed(self, delta: str) -> tuple[str, str]:
        self.text += delta
        return self._advance(final=False)

    def finish(self) -> tuple[str, str]:
        return self._advance(final=True)

    def _advance(self, final: bool) -> tuple[str, str]:
        reasoning = content = ""
        if self.mode == "start" and not self._decide(final):
            return "", ""
        text = self.text
        if self.mode == "reasoning":
            found = min(((at, tag) for tag in self.ends if (at := text.find(tag, self.position)) >= 0), default=None)
            if found is None:
                stop = len(text) if final else min(held_back(text, self.position, tag) for tag in self.ends)
                reasoning, self.position = text[self.position : stop], stop
                return reasoning, ""
            at, tag = found
            reasoning = text[self.position : at]
            self.mode, self.position, self.strip_blank = "content", at + len(tag), True
        if self.strip_blank:
            rest = text[self.position :].lstrip("\r\n")
            if not rest and not final:
                self.position = len(text)
                return reasoning, ""
            self.strip_blank = False
            self.position = len(text) - len(rest)
        content, self.position = text[self.position :], len(text)
        return reasoning, content

    def _decide(self, final: bool) -> bool:
        text = self.text
        stripped = text.lstrip()
        opening = next((tag for tag in self.starts if stripped.startswith(tag)), None)
        if opening is not None:
            self.mode, self.position = "reasoning", len(text) - len(stripped) + len(opening)
        elif any(tag.startswith(stripped) for tag in self.starts) and not final:
            return False  # nothing but (part of) a start tag yet
        else:
            self.mode = "reasoning" if self.starts_in_reasoning else "content"
        return True


class Qwen3ReasoningParser(ReasoningParser):
    """Qwen3: the model opens ``<think>`` itself (``enable_thinking=False``
    puts an empty block in the prompt, and the output is all answer)."""


class DeepSeekR1ReasoningParser(ReasoningParser):
    """DeepSeek-R1: the template opens ``<think>`` in the prompt, so the
    output is reasoning until ``</think>`` (a leading ``<think>`` is dropped)."""

    starts_in_reasoning = True


class MistralReasoningParser(ReasoningParser):
    """Magistral: ``[THINK] ... [/THINK]`` (special tokens), opened by the model."""

    starts, ends = ("[THINK]",), ("[/THINK]",)
    needs_special_tokens = True


class GraniteReasoningParser(ReasoningParser):
    """Granite 3.2+ with ``thinking=True``: "Here is my thought process:" opens
    the reasoning and "Here is my response:" the answer ("Here's" too)."""

    starts = ("Here is my thought process:", "Here's my thought process:")
    ends = ("Here is my response:", "Here's my response:")


class SeedOssReasoningParser(ReasoningParser):
    """Seed-OSS: ``<seed:think> ... </seed:think>``, opened by the model (its
    thinking-budget notes, ``<seed:cot_budget_reflect>``, are part of the reasoning)."""

    starts, ends = ("<seed:think>",), ("</seed:think>",)
    needs_special_tokens = True


class Olmo3ReasoningParser(DeepSeekR1ReasoningParser):
    """Olmo 3 Think: ``<think> ... </think>`` in plain text; some templates open
    the block in the prompt, so the output is reasoning until ``</think>``
    (a leading ``<think>`` is dropped), as vLLM's ``olmo3`` streams it."""


class Glm45ReasoningParser(Qwen3ReasoningParser):
    """GLM-4.5 / 4.6: ``<think> ... </think>`` opened by the model, as Qwen3's
    (the template closes an empty block when thinking is off); single tokens."""

    needs_special_tokens = True


class NoReasoningParser(ReasoningParser):
    """A request whose template turned thinking off: the output is all answer."""

    starts = ()

    def _decide(self, final: bool) -> bool:
        self.mode = "content"
        return True


class DeepSeekV3ReasoningParser(DeepSeekR1ReasoningParser):
    """DeepSeek V3.1 / V3.2 (hybrid): with the template variable ``thinking``
    true the template opens ``<think>`` and the output is reasoning until
    ``</think>`` (as R1's); otherwise it is all answer (``for_request``)."""

    @classmethod
    def for_request(cls, template_kwargs: dict) -> type[ReasoningParser]:
        return DeepSeekR1ReasoningParser if template_kwargs.get("thinking") else NoReasoningParser
