"""Llama 3.x JSON format: an output that starts with a JSON object (after an
optional ``<|python_tag|>``) is tool calls, ``{"name": ..., "parameters":
{...}}``, several separated by ``;``. Any other output is plain text."""

from __future__ import annotations

from octavo.entrypoints.openai.tool_parsers.base import CallSequenceParser, ParsedDelta
from octavo.entrypoints.openai.tool_parsers.json_scan import skip_whitespace

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(CallSequenceParser):
    # <|python_tag|> is a special token, but optional: a call starts with "{" anyway.
    separators = ";"

    def __init__(self) -> None:
        super().__init__()
        self.decided = False

    def _advance(self, final: bool) -> ParsedDelta:
        out = ParsedDelta()
        if not self.decided and not self._decide(final):
            return out
        if self.in_calls:
            self._read_calls(out, final)
        else:
            out.content += self.text[self.position :]
            self.position = len(self.text)
        return out

    def _decide(self, final: bool) -> bool:
        text = self.text
        start = skip_whitespace(text, 0)
        if text.startswith(PYTHON_TAG, start):
            self.in_calls, self.position = True, start + len(PYTHON_TAG)
        elif start < len(text) and not PYTHON_TAG.startswith(text[start:]):
            self.in_calls = text[start] == "{"
            self.position = start if self.in_calls else 0
        elif not final:
            return False  # only whitespace, or the start of the tag, so far
        self.decided = True
        return True
