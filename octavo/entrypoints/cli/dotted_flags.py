"""vLLM's dotted flags for JSON options: ``--speculative-config.method mtp
--speculative-config.num_speculative_tokens 1`` is ``--speculative-config
'{"method": "mtp", "num_speculative_tokens": 1}'`` (deeper keys nest:
``--hf-overrides.rope_parameters.rope_theta 1e6``). A value reads as JSON
where it parses (numbers, true/false, objects), else as a string; dotted
keys go over the object the flag itself gave, in command-line order.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def apply_dotted_flags(argv: list[str], parsers: dict[str, argparse.ArgumentParser]) -> list[str]:
    """``argv`` with each JSON flag's dotted keys folded into one ``--flag JSON``."""
    if not argv or argv[0] not in parsers:
        return argv
    parser = parsers[argv[0]]
    # The JSON flags given in dotted form (their plain form is merged in too).
    dotted = {item.partition("=")[0].partition(".")[0] for item in argv[1:] if item.startswith("--") and "." in item.partition("=")[0]}
    out: list[str] = [argv[0]]
    objects: dict[str, dict[str, Any]] = {}  # flag -> the object built so far
    places: dict[str, int] = {}  # flag -> where its one JSON value goes in ``out``
    index = 1
    while index < len(argv):
        item = argv[index]
        flag, _, rest = item.partition("=") if item.startswith("--") else (item, "", "")
        base, dot, path = flag.partition(".")
        if not item.startswith("--") or base not in dotted or not _takes_json(parser, base):
            out.append(item)
            index += 1
            continue
        if "=" in item:
            value, index = rest, index + 1
        elif index + 1 < len(argv):
            value, index = argv[index + 1], index + 2
        else:
            parser.error(f"{flag} needs a value")
        target = objects.setdefault(base, {})
        if dot:
            _set_path(target, path.split("."), _value(value), parser, flag)
        else:
            target.update(_json_object(value, parser, base))
        if base not in places:
            places[base] = len(out)
            out.extend([base, ""])
    for base, at in places.items():
        out[at + 1] = json.dumps(objects[base])
    return out


def _takes_json(parser: argparse.ArgumentParser, flag: str) -> bool:
    for action in parser._actions:
        if flag in action.option_strings:
            return getattr(action.type, "__name__", "") == "json_object"
    return False


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _json_object(text: str, parser: argparse.ArgumentParser, flag: str) -> dict[str, Any]:
    value = _value(text)
    if not isinstance(value, dict):
        parser.error(f"argument {flag}: must be a JSON object")
    return value


def _set_path(target: dict[str, Any], keys: list[str], value: Any, parser: argparse.ArgumentParser, flag: str) -> None:
    if not all(keys):
        parser.error(f"{flag}: empty key")
    for key in keys[:-1]:
        child = target.setdefault(key, {})
        if not isinstance(child, dict):
            parser.error(f"{flag}: {key!r} is already a value, not an object")
        target = child
    target[keys[-1]] = value
