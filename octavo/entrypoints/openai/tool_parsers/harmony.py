"""gpt-oss's harmony format (vLLM's ``openai``): a message addressed
``to=functions.NAME`` (in the ``commentary`` channel, ``<|constrain|>json``)
is a call of NAME whose body is the arguments' JSON; the ``final`` channel
and preambles (commentary without a recipient) are content. See
``tool_parsers/harmony_format.py`` for the format.

A call's first delta goes out once its header is complete, its arguments as
they arrive (without the whitespace around them; ``{}`` when empty). The
reasoning (``analysis``) and messages to tools other than functions (gpt-oss's
built-in browser and python) are not content: with the ``openai_gptoss``
reasoning parser in front the reasoning never gets here; without it, it is
dropped, as vLLM drops it.
"""

from __future__ import annotations

from octavo.entrypoints.openai.tool_parsers.harmony_format import Event, HarmonyReader
from octavo.entrypoints.openai.tool_parsers.base import ParsedDelta, ToolCallDelta, ToolParser, new_call_id


class HarmonyToolParser(ToolParser):
    needs_special_tokens = True

    def __init__(self) -> None:
        super().__init__()
        self.reader = HarmonyReader()
        self.num_sent = 0  # characters of the open call's arguments sent
        self.pending = ""  # the open call's trailing whitespace, sent only if more follows

    def _advance(self, final: bool) -> ParsedDelta:
        events = self.reader.read(self.text, final)
        out = ParsedDelta()
        for event in events:
            name = event.header.function
            if name is not None:
                self._call(event, name, out)
            elif event.header.is_visible and event.kind == "text":
                out.content += event.text
        return out

    def _call(self, event: Event, name: str, out: ParsedDelta) -> None:
        if event.kind == "open":
            out.tool_calls.append(ToolCallDelta(self.num_calls, id=new_call_id(), name=name))
            self.num_sent, self.pending = 0, ""
        elif event.kind == "text":
            text = self.pending + event.text
            if not self.num_sent:
                text = text.lstrip()
            body = text.rstrip()
            self.pending = text[len(body) :]
            if body:
                out.tool_calls.append(ToolCallDelta(self.num_calls, arguments=body))
                self.num_sent += len(body)
        else:
            if not self.num_sent:
                out.tool_calls.append(ToolCallDelta(self.num_calls, arguments="{}"))
            self.num_calls += 1
