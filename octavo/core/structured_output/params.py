"""What a request's output must match (vLLM's ``StructuredOutputsParams``).

Exactly one kind is set: a JSON schema (``json``), any JSON object
(``json_object``), a regular expression (``regex``), one of a list of
strings (``choice``), an EBNF grammar (``grammar``, xgrammar's dialect:
``root ::= ...``) or a structural tag (``structural_tag``: xgrammar's
``{"type": "structural_tag", "format": {...}}``, tags whose content follows
a schema, with free text around them; vLLM's older shape,
``{"structures": [{"begin", "schema", "end"}], "triggers": [...]}``, is
turned into it: free text until a trigger, then one of the tags). Validation here is about shape only (one kind, right
types, bounded size); whether the schema, regex or grammar compiles is the
compiler's business (``compiler.py``), which front ends ask before a request
is queued.

``key`` names the constraint for the grammar cache: two requests with the
same key share one compiled grammar. A schema given as a dict is keyed by its
JSON text with the property order kept (the order is the order the output
follows).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from octavo.errors import InvalidSamplingParamsError

KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass
class StructuredOutputsParams:
    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool = False
    structural_tag: str | dict | None = None
    # A reasoning model's think block, as single token ids: the constraint holds only after the
    # block ends, so that the model may reason first (vLLM's reasoning-aware structured outputs).
    # ``starts_in_reasoning``: the output begins inside the block (the template opened it).
    reasoning_start_id: int | None = None
    reasoning_end_id: int | None = None
    starts_in_reasoning: bool = False

    def __post_init__(self) -> None:
        set_kinds = [kind for kind in KINDS if self._value(kind) not in (None, False)]
        if len(set_kinds) != 1:
            found = ", ".join(set_kinds) or "none"
            raise InvalidSamplingParamsError(
                f"structured_outputs needs exactly one of {', '.join(KINDS)} (got {found})", param="structured_outputs"
            )
        self._check_types(set_kinds[0])
        markers = (self.reasoning_start_id, self.reasoning_end_id)
        if (markers[0] is None) != (markers[1] is None) or any(
            m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 0) for m in markers
        ):
            raise InvalidSamplingParamsError(
                "reasoning_start_id and reasoning_end_id are two token ids, or neither", param="structured_outputs"
            )

    def _value(self, kind: str):
        return getattr(self, kind)

    def _check_types(self, kind: str) -> None:
        def fail(message: str) -> None:
            raise InvalidSamplingParamsError(message, param=f"structured_outputs.{kind}")

        value = self._value(kind)
        if kind == "json":
            if isinstance(value, str):
                parsed = _loads(value, "the JSON schema", fail)
            elif not isinstance(value, dict):
                fail(f"a JSON schema must be an object (or its JSON text), got {type(value).__name__}")
            else:
                parsed = value
            _check_depth(parsed, "the JSON schema", fail)
        elif kind in ("regex", "grammar"):
            if not isinstance(value, str) or not value:
                fail(f"{kind} must be a non-empty string")
        elif kind == "choice":
            if not isinstance(value, (list, tuple)) or not value:
                fail("choice must be a non-empty list of strings")
            if not all(isinstance(c, str) and c for c in value):
                fail("every choice must be a non-empty string")
            self.choice = list(value)
        elif kind == "structural_tag":
            self.structural_tag = _structural_tag(value, fail)
        elif value is not True:
            fail("json_object must be true or false")

    @property
    def kind(self) -> str:
        return next(kind for kind in KINDS if self._value(kind) not in (None, False))

    @property
    def spec(self) -> str:
        """The constraint as text (what the compiler reads and the cache keys)."""
        kind = self.kind
        value = self._value(kind)
        if kind == "json":
            return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        if kind in ("choice", "structural_tag"):
            return json.dumps(value, ensure_ascii=False)
        if kind == "json_object":
            return ""
        return value

    @property
    def key(self) -> tuple[str, str]:
        return self.kind, self.spec

    def schema(self) -> dict | None:
        """The JSON schema as an object (``json`` kind only)."""
        if self.json is None:
            return None
        return json.loads(self.json) if isinstance(self.json, str) else self.json


def _structural_tag(value, fail) -> dict:
    """A structural tag as xgrammar's object (its JSON text parsed, vLLM's older shape converted)."""
    if isinstance(value, str):
        value = _loads(value, "the structural tag", fail)
    _check_depth(value, "the structural tag", fail)
    if not isinstance(value, dict) or value.get("type", "structural_tag") != "structural_tag":
        fail('a structural tag is an object of "type" "structural_tag"')
    if "format" in value:
        if not isinstance(value["format"], dict):
            fail("the structural tag's format must be an object")
        return {"type": "structural_tag", "format": value["format"]}
    structures, triggers = value.get("structures"), value.get("triggers")
    if not isinstance(structures, list) or not structures or not isinstance(triggers, list) or not triggers:
        fail('a structural tag needs "format", or "structures" and "triggers" (non-empty lists)')
    tags = []
    for item in structures:
        if not isinstance(item, dict) or not all(isinstance(item.get(k), str) for k in ("begin", "end")):
            fail('each structure needs "begin" and "end" strings and a "schema"')
        schema = item.get("schema", {})
        if not isinstance(schema, dict):
            fail("each structure's schema must be an object")
        content = {"type": "json_schema", "json_schema": schema}
        tags.append({"type": "tag", "begin": item["begin"], "content": content, "end": item["end"]})
    if not all(isinstance(t, str) and t for t in triggers):
        fail("each trigger must be a non-empty string")
    return {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": triggers, "tags": tags}}


# Deeper constraints are refused: every walk over them (checks, xgrammar) would recurse that deep.
MAX_NESTING = 128


def _loads(text: str, what: str, fail):
    try:
        return json.loads(text)
    except RecursionError:
        fail(f"{what} is nested more than {MAX_NESTING} levels deep")
    except ValueError as exc:
        fail(f"{what} is not valid JSON: {exc}")


def _check_depth(value, what: str, fail) -> None:
    """Refuse objects and lists nested more than ``MAX_NESTING`` deep (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_NESTING:
            fail(f"{what} is nested more than {MAX_NESTING} levels deep")
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
