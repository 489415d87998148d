"""Request fields Octavo does not honour. A field that would change the
output is refused with a 400 naming it; one that cannot (bookkeeping for the
client's own records, routing hints for OpenAI's service) is accepted and
ignored. ``docs/serving.md`` lists both.

Fields the request models declare are honoured (or refused with a reason
where they are read); this checks the undeclared rest.
"""

from __future__ import annotations

from typing import Any

from octavo.errors import InvalidArgumentError

# Safe to ignore: they never change what is generated.
IGNORABLE_FIELDS = {
    "chat": frozenset({"metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier"}),
    "completions": frozenset({"metadata", "store", "service_tier"}),
    "messages": frozenset({"service_tier"}),
    "responses": frozenset(
        {"service_tier", "prompt_cache_key", "prompt_cache_retention", "safety_identifier", "stream_options"}
    ),
    "tokenize": frozenset(),
    "detokenize": frozenset(),
}
# Known, not honoured, and they would change the output: named reasons.
REFUSED_FIELDS = {
    "audio": "audio output is not supported",
    "modalities": "only text output is supported",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "functions": "the legacy 'functions' field is not supported; send 'tools'",
    "function_call": "the legacy 'function_call' field is not supported; send 'tool_choice'",
    "verbosity": "verbosity is not supported",
    "guided_decoding_backend": "the structured-output backend is always xgrammar",
}


def check_undeclared_fields(body: Any, route: str) -> None:
    """400 for every undeclared field but the safely ignorable ones."""
    for name, value in (body.model_extra or {}).items():
        if name in IGNORABLE_FIELDS[route]:
            continue
        if name == "modalities" and value == ["text"]:
            continue
        reason = REFUSED_FIELDS.get(name, "it is not a field Octavo knows, and it could change the output")
        raise InvalidArgumentError(f"{name} is not supported: {reason}", param=name)
