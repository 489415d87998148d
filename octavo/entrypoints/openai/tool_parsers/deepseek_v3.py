"""DeepSeek V3 format (special tokens): text, then
``<｜tool▁calls▁begin｜>`` and calls, each
``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\nARGS\\n```<｜tool▁call▁end｜>``
(V3), or ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>`` (V3.1),
then ``<｜tool▁calls▁end｜>``. Each call is sent whole when its end token
arrives (or when the output ends, with what arrived); text after the calls is
content.
"""

from __future__ import annotations

from octavo.entrypoints.openai.tool_parsers.base import ParsedDelta, ToolCallDelta, ToolParser, new_call_id, read_until

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


class DeepSeekV3ToolParser(ToolParser):
    needs_special_tokens = True

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
            content, stop, found = read_until(text, self.position, CALLS_BEGIN, final)
            out.content += content
            self.position = stop
            if not found:
                return out
            self.in_calls, self.position = True, stop + len(CALLS_BEGIN)
        while True:
            rest = text[self.position:].lstrip()
            at = len(text) - len(rest)
            if rest.startswith(CALLS_END):
                self.in_calls, self.after_calls, self.position = False, True, at + len(CALLS_END)
                return out.extend(self._advance(final))
            if not rest.startswith(CALL_BEGIN):
                if final or (rest and not CALL_BEGIN.startswith(rest) and not CALLS_END.startswith(rest)):
                    self.in_calls, self.after_calls, self.position = False, True, at
                    return out.extend(self._advance(final))
                return out
            end = text.find(CALL_END, at)
            if end < 0 and not final:
                return out
            body = text[at + len(CALL_BEGIN):end if end >= 0 else len(text)]
            self._call(body, out)
            self.position = end + len(CALL_END) if end >= 0 else len(text)
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
