"""A ``StructuredOutputsParams`` -> an xgrammar ``Grammar`` (tokenizer-free).

JSON schemas are checked first (``schema_check``), then converted in strict
mode: properties the schema does not list are never generated, so an output
validates whatever ``additionalProperties`` says. JSON is written compactly
(``", "`` and ``": "`` between tokens, no other whitespace): free whitespace
lets a model stall in it for ever, and capping its runs multiplies the
grammar's size about twentyfold. ``json_object`` is any JSON object; ``choice`` is an
alternation of literal strings; ``grammar`` is EBNF with a ``root`` rule.
Any conversion error (bad regex, undefined rule, unsupported schema type)
becomes ``StructuredOutputError`` naming the reason.
"""

from __future__ import annotations

import json
from typing import Any

from octavo.core.structured_output.params import StructuredOutputsParams
from octavo.core.structured_output.schema_check import check_json_schema, for_xgrammar
from octavo.errors import StructuredOutputError

def build_grammar(params: StructuredOutputsParams) -> Any:
    import xgrammar as xgr

    kind = params.kind
    try:
        if kind == "json":
            schema = params.schema()
            check_json_schema(schema)
            return xgr.Grammar.from_json_schema(json.dumps(for_xgrammar(schema)), strict_mode=True, any_whitespace=False)
        if kind == "json_object":
            return xgr.Grammar.from_json_schema('{"type": "object"}', strict_mode=False, any_whitespace=False)
        if kind == "regex":
            return xgr.Grammar.from_regex(params.regex)
        if kind == "choice":
            alternatives = " | ".join(json.dumps(choice, ensure_ascii=False) for choice in params.choice)
            return xgr.Grammar.from_ebnf(f"root ::= {alternatives}")
        if kind == "structural_tag":
            return xgr.Grammar.from_structural_tag(_checked_schemas(params.structural_tag))
        return xgr.Grammar.from_ebnf(params.grammar)
    except StructuredOutputError:
        raise
    except Exception as exc:  # xgrammar reports every conversion error as RuntimeError/ValueError
        raise StructuredOutputError(f"the {_NAMES[kind]} does not compile: {_reason(exc)}") from None


def _checked_schemas(node):
    """``node`` with every JSON schema inside checked (``check_json_schema``) and in xgrammar's terms."""
    if isinstance(node, list):
        return [_checked_schemas(item) for item in node]
    if not isinstance(node, dict):
        return node
    if node.get("type") == "json_schema" and isinstance(node.get("json_schema"), dict):
        check_json_schema(node["json_schema"])
        return {**node, "json_schema": for_xgrammar(node["json_schema"])}
    return {key: _checked_schemas(value) for key, value in node.items()}


_NAMES = {
    "json": "JSON schema",
    "json_object": "JSON object grammar",
    "regex": "regex",
    "choice": "choice list",
    "grammar": "grammar",
    "structural_tag": "structural tag",
}


def _reason(exc: Exception) -> str:
    """xgrammar's message without its C++ source location prefix."""
    text = str(exc).strip()
    last = text.splitlines()[-1] if text else type(exc).__name__
    # "[15:48:22] /project/cpp/regex_converter.cc:94: Regex parsing error ..."
    if last.startswith("[") and ".cc:" in last:
        last = last.split(": ", 1)[-1]
    return last
