"""Refuse JSON schemas whose output the grammar would not hold to.

xgrammar turns a JSON schema into a grammar, but it skips some validation
keywords without a word (``uniqueItems``, ``not``, ``if``/``then``/``else``,
``maxProperties``, ``multipleOf`` on numbers, unknown ``format`` values, ...):
an output built from such a grammar may not validate against the schema. So
a schema is checked twice before it is compiled: against its metaschema (an
invalid schema is the client's error) and for keywords the grammar does not
enforce, each refused with its location. Annotation keywords (``title``,
``description``, ``default``, ``examples``, vendor ``x-*`` keys, ...) change
nothing and pass.

Constraints that are enforced: ``type`` (one or a list), ``properties``,
``required``, ``additionalProperties`` (extra properties are never generated),
``patternProperties``, ``minProperties``, ``items``, ``prefixItems``,
``minItems``, ``maxItems``, ``enum``, ``const``, ``anyOf``, ``oneOf`` (where
branches overlap, one branch is generated, which may also match another),
``allOf`` with one subschema, local ``$ref`` with ``$defs``/``definitions``,
string ``minLength``, ``maxLength`` (not with a ``pattern`` or ``format``:
xgrammar would drop the length), ``pattern`` and the formats in
``SUPPORTED_FORMATS``, numeric bounds, and ``multipleOf`` on integers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from octavo.errors import StructuredOutputError

# Deeper schemas are refused (they would only exhaust recursion somewhere).
MAX_SCHEMA_DEPTH = 64

SUPPORTED_FORMATS = frozenset(
    {
        "email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid", "uri",
        "uri-reference", "uri-template", "json-pointer", "relative-json-pointer",
    }
)
# Validation keywords the grammar cannot hold the output to.
UNSUPPORTED_KEYWORDS = frozenset(
    {
        "not", "if", "then", "else", "contains", "minContains", "maxContains", "maxProperties", "propertyNames",
        "dependentRequired", "dependentSchemas", "dependencies", "$dynamicRef", "$recursiveRef",
    }
)
# Keywords whose value is one subschema, and those whose value maps names to subschemas.
_SUBSCHEMA = ("additionalProperties", "items", "not", "if", "then", "else", "contains", "propertyNames",
              "unevaluatedItems", "unevaluatedProperties", "additionalItems")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")


class UnsupportedSchemaError(StructuredOutputError):
    """The JSON schema is invalid, or uses a keyword the grammar does not enforce."""


def check_json_schema(schema: Any) -> None:
    """Raise ``UnsupportedSchemaError`` naming the first problem found."""
    if not isinstance(schema, dict):
        raise UnsupportedSchemaError(f"a JSON schema must be an object, got {type(schema).__name__}")
    # Depth first: the metaschema check recurses too.
    subschemas = list(_subschemas(schema, "#"))
    _check_metaschema(schema)
    for path, subschema in subschemas:
        problem = _unsupported(subschema)
        if problem is not None:
            raise UnsupportedSchemaError(f"JSON schema at {path}: {problem}")


def _check_metaschema(schema: dict) -> None:
    from jsonschema import Draft202012Validator, validators
    from jsonschema.exceptions import SchemaError

    validator = validators.validator_for(schema, default=Draft202012Validator)
    try:
        validator.check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(part) for part in exc.absolute_path)
        raise UnsupportedSchemaError(f"invalid JSON schema at #/{where}: {exc.message}") from None


def _unsupported(schema: dict) -> str | None:
    for keyword in UNSUPPORTED_KEYWORDS.intersection(schema):
        return f"keyword {keyword!r} is not supported (the output could not be held to it)"
    if schema.get("uniqueItems") is True:
        return "keyword 'uniqueItems' is not supported (the output could not be held to it)"
    for keyword in ("unevaluatedItems", "unevaluatedProperties", "additionalItems"):
        if keyword in schema and schema[keyword] is not False:
            return f"keyword {keyword!r} is only supported as false"
    if "multipleOf" in schema and schema.get("type") != "integer":
        return "keyword 'multipleOf' is only supported with type 'integer'"
    if isinstance(schema.get("allOf"), list) and len(schema["allOf"]) > 1:
        return "keyword 'allOf' is only supported with one subschema"
    if ("minLength" in schema or "maxLength" in schema) and ("pattern" in schema or "format" in schema):
        return "minLength/maxLength cannot be combined with pattern or format (put the length in the pattern)"
    fmt = schema.get("format")
    if isinstance(fmt, str) and fmt not in SUPPORTED_FORMATS:
        return f"format {fmt!r} is not supported (supported: {', '.join(sorted(SUPPORTED_FORMATS))})"
    ref = schema.get("$ref")
    if isinstance(ref, str) and not ref.startswith("#"):
        return f"only local references ('#/...') are supported, got $ref {ref!r}"
    return None


def for_xgrammar(schema: dict) -> dict:
    """A copy of a checked ``schema`` that xgrammar compiles faithfully.

    xgrammar writes a string with ``minLength``/``maxLength`` as characters
    from ``[^"\\\r\n]``, which lets other control characters through:
    invalid JSON. As the equivalent ``pattern`` it excludes them all.
    """
    import copy

    schema = copy.deepcopy(schema)
    for _, subschema in _subschemas(schema, "#"):
        if "minLength" in subschema or "maxLength" in subschema:
            low = subschema.pop("minLength", 0)
            high = subschema.pop("maxLength", "")
            subschema["pattern"] = f"^.{{{low},{high}}}$"
    return schema


def _subschemas(schema: Any, path: str, depth: int = 0) -> Iterator[tuple[str, dict]]:
    """Every schema object in ``schema`` (itself included), with its JSON pointer."""
    if not isinstance(schema, dict):
        return
    if depth > MAX_SCHEMA_DEPTH:
        raise UnsupportedSchemaError(f"JSON schema at {path}: nested more than {MAX_SCHEMA_DEPTH} levels deep")
    yield path, schema
    depth += 1
    for keyword in _SUBSCHEMA:
        if isinstance(schema.get(keyword), dict):
            yield from _subschemas(schema[keyword], f"{path}/{keyword}", depth)
    for keyword in _SUBSCHEMA_MAPS:
        if isinstance(schema.get(keyword), dict):
            for name, sub in schema[keyword].items():
                yield from _subschemas(sub, f"{path}/{keyword}/{name}", depth)
    for keyword in _SUBSCHEMA_LISTS:
        if isinstance(schema.get(keyword), list):
            for index, sub in enumerate(schema[keyword]):
                yield from _subschemas(sub, f"{path}/{keyword}/{index}", depth)
