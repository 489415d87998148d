"""Request fields that constrain the output -> ``StructuredOutputsParams``,
and the compile check every such request passes before it is admitted.

Accepted (one constraint per request): OpenAI's ``response_format``
(``json_object``; ``json_schema`` with or without ``strict``: the schema is
always enforced; vLLM's ``structural_tag``), vLLM's ``structured_outputs`` (``json``, ``regex``,
``choice``, ``grammar``, ``json_object``, ``structural_tag``) and its older ``guided_json`` /
``guided_regex`` / ``guided_choice`` / ``guided_grammar``. Two at once is a
400 naming both. The check compiles the constraint (off the event loop,
within the compile time limit): a schema that is invalid or uses a keyword
the grammar cannot enforce, a regex or grammar that does not compile, or one
over the size or time limit is a 400 naming the field, and nothing is queued.
"""

from __future__ import annotations

import json
from typing import Any

from octavo.core.sampling_params import SamplingParams
from octavo.core.structured_output.params import KINDS, StructuredOutputsParams
from octavo.errors import InvalidArgumentError, OctavoError, StructuredOutputError

GUIDED_FIELDS = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


def constraint_from_request(body: Any) -> tuple[StructuredOutputsParams | None, str | None]:
    """The request's constraint and the field it came from (for error messages)."""
    found: list[tuple[str, str, StructuredOutputsParams]] = []  # (field, param for errors, constraint)
    response_format = getattr(body, "response_format", None)
    if response_format is not None:
        params = _from_response_format(response_format)
        if params is not None:
            param = "response_format.json_schema.schema" if params.kind == "json" else "response_format"
            found.append(("response_format", param, params))
    structured = getattr(body, "structured_outputs", None)
    if structured is not None:
        params = _make("structured_outputs", **_as_dict(structured, "structured_outputs"))
        found.append(("structured_outputs", "structured_outputs", params))
    for field, kind in GUIDED_FIELDS.items():
        value = getattr(body, field, None)
        if value is not None:
            found.append((field, field, _make(field, **{kind: value})))
    if len(found) > 1:
        names = " and ".join(name for name, _, _ in found)
        raise InvalidArgumentError(f"send one output constraint, not {names}", param=found[1][0])
    return (found[0][2], found[0][1]) if found else (None, None)


def _from_response_format(response_format: Any) -> StructuredOutputsParams | None:
    kind = response_format.type
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    if kind == "json_schema":
        spec = response_format.json_schema
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise InvalidArgumentError(
                "response_format json_schema needs json_schema.schema (an object)", param="response_format.json_schema"
            )
        return _make("response_format.json_schema.schema", json=spec["schema"])
    if kind == "structural_tag":
        tag = {k: v for k, v in (("format", response_format.format), ("structures", response_format.structures),
                                 ("triggers", response_format.triggers)) if v is not None}
        return _make("response_format", structural_tag={"type": "structural_tag", **tag})
    raise InvalidArgumentError(
        f"response_format type {kind!r} is not supported (text, json_object, json_schema, structural_tag)",
        param="response_format.type",
    )


def _as_dict(value: Any, param: str) -> dict:
    if hasattr(value, "model_dump"):
        value = value.model_dump(exclude_none=True)
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"{param} must be an object", param=param)
    unknown = set(value) - set(KINDS)
    if unknown:
        raise InvalidArgumentError(f"{param} has unsupported field(s): {', '.join(sorted(unknown))}", param=param)
    if isinstance(value.get("json"), str):
        try:
            value = {**value, "json": json.loads(value["json"])}
        except RecursionError:
            raise InvalidArgumentError(f"{param}.json is nested too deeply", param=f"{param}.json") from None
        except ValueError as exc:
            raise InvalidArgumentError(f"{param}.json is not valid JSON: {exc}", param=f"{param}.json") from None
    return value


def _make(param: str, **fields: Any) -> StructuredOutputsParams:
    try:
        return StructuredOutputsParams(**fields)
    except OctavoError as exc:
        raise InvalidArgumentError(exc.message, param=param) from None


async def check_constraint(engine: Any, params: SamplingParams, param: str | None) -> None:
    """Compile ``params``' constraint (the engine's validator holds the cache);
    raise the typed 400 naming ``param`` if it cannot be used."""
    constraint = params.structured_outputs
    if constraint is None:
        return
    compiler = engine.grammar_compiler
    try:
        await compiler.wait_async(compiler.submit(constraint))
    except StructuredOutputError as exc:
        exc.param = param
        raise
