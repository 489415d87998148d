"""Pythonic format (Llama 3.2 and 4, vLLM's ``pythonic`` / ``llama4_pythonic``):
an output that is a Python list of calls with keyword arguments,
``[get_weather(city="Paris", days=1), get_time()]``, optionally between
``<|python_start|>`` and ``<|python_end|>``. Any other output is text.

The argument values are Python literals (strings, numbers, True/False/None,
lists, dicts), sent as a JSON object. A call list is read whole once it
closes (Python syntax cannot be cut into JSON pieces), so each call arrives
in one delta; a list that never closes, or is not all calls, is text.
"""

from __future__ import annotations

import ast
import json

from octavo.entrypoints.openai.tool_parsers.base import ParsedDelta, ToolCallDelta, ToolParser, new_call_id
from octavo.entrypoints.openai.tool_parsers.json_scan import skip_whitespace

START, END = "<|python_start|>", "<|python_end|>"


class PythonicToolParser(ToolParser):
    def __init__(self) -> None:
        super().__init__()
        self.start: int | None = None  # where the call list begins ("[")
        self.decided = False  # calls (start set) or text
        self.scanned = 0  # "]" positions before it were tried
        self.done = False
        self.end_tag_read = True  # set False when a call list closes

    def _advance(self, final: bool) -> ParsedDelta:
        out = ParsedDelta()
        text = self.text
        if not self.decided and not self._decide(final):
            return out
        if self.start is None or self.done:
            if self.done and not self._skip_end_tag(final):
                return out
            out.content += text[self.scanned:]
            self.scanned = len(text)
            return out
        while (close := text.find("]", max(self.scanned, self.start))) >= 0:
            self.scanned = close + 1
            calls = _calls(text[self.start:close + 1])
            if calls is not None:
                for name, arguments in calls:
                    out.tool_calls.append(ToolCallDelta(self.num_calls, id=new_call_id(), name=name, arguments=arguments))
                    self.num_calls += 1
                self.done, self.scanned, self.end_tag_read = True, close + 1, False
                return out.extend(self._advance(final))
        if final:  # the list never closed into calls: it was text
            out.content += text
            self.done, self.scanned = True, len(text)
        return out

    def _skip_end_tag(self, final: bool) -> bool:
        """Past the call list: drop a ``<|python_end|>`` after it; False while it may still be arriving."""
        if self.end_tag_read:
            return True
        text = self.text
        at = skip_whitespace(text, self.scanned)
        if text.startswith(END, at):
            self.scanned = at + len(END)
        elif END.startswith(text[at:]) and not final:
            return False
        self.end_tag_read = True
        return True

    def _decide(self, final: bool) -> bool:
        text = self.text
        start = skip_whitespace(text, 0)
        if text.startswith(START, start):
            start = skip_whitespace(text, start + len(START))
        elif START.startswith(text[start:]) and not final:
            return False  # nothing yet, or the start of the tag
        if start >= len(text) and not final:
            return False
        self.decided = True
        self.start = start if text.startswith("[", start) else None
        return True


_JSON_NAMES = {"null": None, "true": True, "false": False}


class _JsonNames(ast.NodeTransformer):
    """``null`` / ``true`` / ``false`` as the constants they mean (Olmo 3 writes JSON's names)."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in _JSON_NAMES:
            return ast.copy_location(ast.Constant(_JSON_NAMES[node.id]), node)
        return node


def _calls(source: str, json_names: bool = False) -> list[tuple[str, str]] | None:
    """``[f(a=1), ...]`` -> [(name, JSON arguments)], or None if it is not a
    list of such calls; ``json_names``: values may say null, true, false."""
    try:
        tree = ast.parse(source, mode="eval").body
    except SyntaxError:
        return None
    if json_names:
        tree = _JsonNames().visit(tree)
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or node.args or not isinstance(node.func, (ast.Name, ast.Attribute)):
            return None
        try:
            arguments = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg is not None}
            text = json.dumps(arguments, ensure_ascii=False)
        except (ValueError, TypeError, SyntaxError):
            return None
        calls.append((ast.unparse(node.func), text))
    return calls
