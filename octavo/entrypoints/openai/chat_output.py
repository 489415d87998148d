"""One choice's generated text -> what the chat APIs send: reasoning, content
and tool calls, as deltas while streaming and whole at the end.

``OutputShaper`` chains the server's reasoning parser (if any) and a tool
reader: the ``--tool-call-parser`` for ``tool_choice: auto``, or the reader of
the grammar-constrained JSON for ``required`` and named choices. Both APIs use
it (OpenAI chat here, Anthropic messages in ``anthropic/``), streamed or not:
a non-streamed response is the sum of the deltas of the whole text, so the
two always agree.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from octavo.entrypoints.openai.reasoning import ReasoningParser
from octavo.entrypoints.openai.reasoning.harmony import HarmonyReasoningParser
from octavo.entrypoints.openai.tool_parsers import TOOL_PARSERS, ToolCallDelta, ToolParser
from octavo.entrypoints.openai.tool_parsers.base import CallSequenceParser, ParsedDelta, new_call_id
from octavo.entrypoints.openai.tool_parsers.harmony import HarmonyToolParser
from octavo.entrypoints.openai.tools import ToolUse


@dataclass
class ChoiceDelta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)

    def joined(self, later: ChoiceDelta) -> ChoiceDelta:
        return ChoiceDelta(self.reasoning + later.reasoning, self.content + later.content, self.tool_calls + later.tool_calls)


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass
class ChoiceMessage:
    """A whole choice: the sum of its deltas."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def add(self, delta: ChoiceDelta) -> None:
        self.reasoning += delta.reasoning
        self.content += delta.content
        for call in delta.tool_calls:
            if call.id is not None:
                self.tool_calls.append(ToolCall(call.id, call.name or "", call.arguments))
            else:
                self.tool_calls[call.index].arguments += call.arguments


class RequiredCallsReader(CallSequenceParser):
    """``tool_choice: required``: the output is ``[{"name": ..., "parameters": {...}}, ...]``."""

    separators = ",[]"

    def __init__(self) -> None:
        super().__init__()
        self.in_calls = True

    def _advance(self, final: bool) -> ParsedDelta:
        out = ParsedDelta()
        self._read_calls(out, final)
        return out


class NamedCallReader(ToolParser):
    """A named ``tool_choice``: the whole output is that function's arguments."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.num_sent = 0

    def _advance(self, final: bool) -> ParsedDelta:
        out = ParsedDelta()
        if self.num_calls == 0:
            out.tool_calls.append(ToolCallDelta(0, id=new_call_id(), name=self.name))
            self.num_calls = 1
        piece = self.text[self.num_sent :]
        if not self.num_sent:
            piece = piece.lstrip()
        if piece:
            out.tool_calls.append(ToolCallDelta(0, arguments=piece))
        self.num_sent = len(self.text)
        return out


def tool_reader_factory(use: ToolUse, parser_name: str | None) -> Callable[[], ToolParser] | None:
    if use.mode == "required":
        return RequiredCallsReader
    if use.mode == "named":
        return lambda: NamedCallReader(use.name)
    if use.mode == "auto" and parser_name is not None:
        parser = TOOL_PARSERS[parser_name]
        return functools.partial(parser, use.tools) if getattr(parser, "wants_tools", False) else parser
    return None


class OutputShaper:
    def __init__(
        self,
        reasoning: ReasoningParser | None,
        tools: ToolParser | None,
        parallel_tool_calls: bool = True,
        hidden_suffixes: tuple[str, ...] = (),
    ) -> None:
        self.reasoning = reasoning
        self.tools = tools
        # Harmony (gpt-oss): the tool parser reads the calls from the messages' headers, so
        # the reasoning parser in front hands it the messages as written, not just their text.
        if isinstance(reasoning, HarmonyReasoningParser) and isinstance(tools, HarmonyToolParser):
            reasoning.forward_messages = True
        self.parallel_tool_calls = parallel_tool_calls
        # The EOS token's text, where special tokens are kept for the parser:
        # held back at the end of a piece, dropped when the output ends there.
        self.hidden_suffixes = hidden_suffixes
        self.held = ""
        self.num_tool_calls = 0

    def feed(self, text: str) -> ChoiceDelta:
        text, self.held = self.held + text, ""
        for suffix in self.hidden_suffixes:
            if suffix and text.endswith(suffix):
                text, self.held = text[: -len(suffix)], suffix
                break
        return self._shape(*(self.reasoning.feed(text) if self.reasoning else ("", text)), final=False)

    def finish(self) -> ChoiceDelta:
        reasoning, content = self.reasoning.finish() if self.reasoning else ("", "")
        return self._shape(reasoning, content, final=True)

    def _shape(self, reasoning: str, content: str, final: bool) -> ChoiceDelta:
        delta = ChoiceDelta(reasoning=reasoning)
        if self.tools is None:
            delta.content = content
            return delta
        parsed = self.tools.feed(content)
        if final:
            parsed.extend(self.tools.finish())
        delta.content = parsed.content
        calls = parsed.tool_calls
        if not self.parallel_tool_calls:  # honoured by keeping the first call only
            calls = [call for call in calls if call.index == 0]
        delta.tool_calls = calls
        self.num_tool_calls = max([self.num_tool_calls] + [call.index + 1 for call in calls])
        return delta

    def finish_reason(self, engine_reason: str | None) -> str | None:
        """``tool_calls`` when the output ended after calling tools."""
        if engine_reason == "stop" and self.num_tool_calls:
            return "tool_calls"
        return engine_reason


# ------------------------------------------------------------ OpenAI shapes


def openai_message(message: ChoiceMessage, with_reasoning: bool) -> dict:
    fields: dict = {"role": "assistant", "content": message.content or (None if message.tool_calls else "")}
    if with_reasoning:
        fields["reasoning_content"] = message.reasoning or None
    if message.tool_calls:
        fields["tool_calls"] = [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in message.tool_calls
        ]
    return fields


def openai_delta(delta: ChoiceDelta) -> dict:
    fields: dict = {}
    if delta.reasoning:
        fields["reasoning_content"] = delta.reasoning
    if delta.content:
        fields["content"] = delta.content
    calls: list[dict] = []
    for call in delta.tool_calls:
        if call.id is None and calls and calls[-1]["index"] == call.index:
            calls[-1]["function"]["arguments"] += call.arguments  # one entry per call and chunk
        elif call.id is not None:
            function = {"name": call.name, "arguments": call.arguments}
            calls.append({"index": call.index, "id": call.id, "type": "function", "function": function})
        else:
            calls.append({"index": call.index, "function": {"arguments": call.arguments}})
    if calls:
        fields["tool_calls"] = calls
    return fields
