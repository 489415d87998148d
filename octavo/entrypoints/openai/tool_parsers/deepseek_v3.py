"""DeepSeek V3 format (special tokens): text, then
``<｜tool▁calls▁begin｜>`` and calls, each
``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\nARGS\\n```<｜tool▁call▁end｜>``
(V3), or ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>`` (V3.1),
then ``<｜tool▁calls▁end｜>``. Each call is sent whole when its end token
arrives (or when the output ends, with what arrived); text after the calls is
content.

Kimi K2 (vLLM's ``kimi_k2``; a DeepSeek V3 architecture) writes the same
structure with its own tokens: ``<|tool_calls_section_begin|>``, then calls
``<|tool_call_begin|>functions.NAME:INDEX<|tool_call_argument_begin|>ARGS<|tool_call_end|>``,
then ``<|tool_calls_section_end|>``; ``functions.NAME:INDEX`` is the call's
id (Kimi's template names each tool result by it).
"""

from __future__ import annotations

from octavo.entrypoints.openai.tool_parsers.base import ParsedDelta, ToolCallDelta, ToolParser, new_call_id, read_until

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


class DeepSeekV3ToolParser(ToolParser):
    needs_special_tokens = True
    # The section's and each call's markers (Kimi K2 has its own).
    calls_begin, calls_end, call_begin, call_end = CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END

    def __init__(self) -> None:
        super().__init__()
        self.position = 0
        self.in_calls = False
        self.after_calls = False

    def _advance(self, final: bool) -> ParsedDelta:
        out = ParsedDelta()
        text = self.text
        if self.after_calls:  # the rest is text
            out.content += text[self.position:]
            self.position = len(text)
            return out
        if not self.in_calls:
            content, stop, found = read_until(text, self.position, self.calls_begin, final)
            out.content += content
            self.position = stop
            if not found:
                return out
            self.in_calls, self.position = True, stop + len(self.calls_begin)
        while True:
            rest = text[self.position:].lstrip()
            at = len(text) - len(rest)
            if rest.startswith(self.calls_end):
                self.in_calls, self.after_calls, self.position = False, True, at + len(self.calls_end)
                return out.extend(self._advance(final))
            if not rest.startswith(self.call_begin):
                if final or (rest and not self.call_begin.startswith(rest) and not self.calls_end.startswith(rest)):
                    self.in_calls, self.after_calls, self.position = False, True, at
                    return out.extend(self._advance(final))
                return out
            end = text.find(self.call_end, at)
            if end < 0 and not final:
                return out
            body = text[at + len(self.call_begin):end if end >= 0 else len(text)]
            self._call(body, out)
            self.position = end + len(self.call_end) if end >= 0 else len(text)
            if end < 0:
                return out

    def _call(self, body: str, out: ParsedDelta) -> None:
        head, _, tail = body.partition(SEP)
        if head.strip() == "function":  # V3: NAME, newline, a fenced JSON block
            name, _, arguments = tail.partition("\n")
            arguments = arguments.strip().removeprefix("```json").removesuffix("```").strip()
        else:  # V3.1: the name before the separator
            name, arguments = head, tail.strip()
        out.tool_calls.append(ToolCallDelta(self.num_calls, id=new_call_id(), name=name.strip(),
                                            arguments=arguments or "{}"))
        self.num_calls += 1


class KimiK2ToolParser(DeepSeekV3ToolParser):
    calls_begin, calls_end = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
    call_begin, call_end = "<|tool_call_begin|>", "<|tool_call_end|>"

    def _call(self, body: str, out: ParsedDelta) -> None:
        call_id, _, arguments = body.partition("<|tool_call_argument_begin|>")
        call_id = call_id.strip()
        name = call_id.removeprefix("functions.").rpartition(":")[0] or call_id.removeprefix("functions.")
        out.tool_calls.append(ToolCallDelta(self.num_calls, id=call_id or new_call_id(), name=name,
                                            arguments=arguments.strip() or "{}"))
        self.num_calls += 1
