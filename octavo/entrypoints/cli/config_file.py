"""``--config FILE.yaml``: a command's options from a YAML file, as vLLM reads them.

Each key is a flag of the command without its dashes (``tensor-parallel-size``
or ``tensor_parallel_size``; ``model`` is the model, positional or not), each
value what the flag takes: a number or string, ``true`` / ``false`` for
switches, a list for flags that take several values, a mapping for flags
that take JSON. The values become the command's defaults, so flags given on
the command line win. An unknown key, a value of the wrong kind or a choice
the flag does not offer stops the command with a message naming the key.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

_SWITCHES = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse.BooleanOptionalAction)


def apply_config_file(argv: list[str], parsers: dict[str, argparse.ArgumentParser]) -> list[str]:
    """``argv`` without ``--config FILE`` (or ``--config=FILE``); the file's
    values set as defaults of the command's parser."""
    if not argv or argv[0] not in parsers:
        return argv
    parser = parsers[argv[0]]
    rest, path = _take_config_flag(argv, parser)
    if path is None:
        return argv
    for key, value in _read(path, parser).items():
        _set_default(parser, key, value)
    return rest


def add_config_flag(parser: argparse.ArgumentParser) -> None:
    """Document ``--config`` in the command's help (``apply_config_file`` reads it before parsing)."""
    parser.add_argument(
        "--config", metavar="FILE.yaml", default=None,
        help="options from a YAML file (keys: flag names without dashes); flags on the command line win",
    )


def _take_config_flag(argv: list[str], parser: argparse.ArgumentParser) -> tuple[list[str], str | None]:
    rest, path, index = [argv[0]], None, 1
    while index < len(argv):
        item = argv[index]
        if item == "--config":
            if index + 1 >= len(argv):
                parser.error("--config needs a YAML file")
            path, index = argv[index + 1], index + 2
            continue
        if item.startswith("--config="):
            path = item.partition("=")[2]
        else:
            rest.append(item)
        index += 1
    return rest, path


def _read(path: str, parser: argparse.ArgumentParser) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        parser.error(f"--config: cannot read {path}: {exc.strerror or exc}")
    except yaml.YAMLError as exc:
        parser.error(f"--config: {path} is not valid YAML: {exc}")
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        parser.error(f"--config: {path} must hold a mapping of option names to values")
    return data


def _action_for(parser: argparse.ArgumentParser, key: str) -> argparse.Action | None:
    flag = "--" + key.replace("_", "-")
    for action in parser._actions:
        if flag in action.option_strings or (not action.option_strings and action.dest == key.replace("-", "_")):
            return action
    return None


def _set_default(parser: argparse.ArgumentParser, key: str, value: Any) -> None:
    action = _action_for(parser, key)
    if action is None or action.dest in ("help", "config", "version"):
        parser.error(f"--config: unknown option {key!r}")
    if getattr(action, "refuses", False):
        if value:
            parser.error(f"--config: {key}: " + action.refuses)
        return
    if isinstance(action, _SWITCHES):
        if not isinstance(value, bool):
            parser.error(f"--config: {key} is a switch: true or false, not {value!r}")
        value = (not value) if isinstance(action, argparse._StoreFalseAction) else value
    elif isinstance(value, list):
        if action.nargs not in ("+", "*") and not isinstance(action.nargs, int):
            parser.error(f"--config: {key} takes one value, not a list")
        value = [_converted(parser, action, key, item) for item in value]
    elif isinstance(value, dict):
        if value and action.type is not None and getattr(action.type, "__name__", "") != "json_object":
            parser.error(f"--config: {key} does not take a mapping")
    else:
        value = _converted(parser, action, key, value)
        if action.nargs in ("+", "*"):
            value = [value]
    parser.set_defaults(**{action.dest: value})


def _converted(parser: argparse.ArgumentParser, action: argparse.Action, key: str, value: Any) -> Any:
    """The value as the flag would have parsed it from the command line."""
    if isinstance(value, (dict, list, bool)) or value is None:
        parser.error(f"--config: {key} takes a single value, not {value!r}")
    if action.type is not None:
        try:
            value = action.type(str(value))
        except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
            parser.error(f"--config: {key}: {exc or 'invalid value'} ({value!r})")
    elif not isinstance(value, str):
        value = str(value)
    if action.choices is not None and value not in action.choices:
        parser.error(f"--config: {key} must be one of {list(action.choices)}, not {value!r}")
    accepted = getattr(action, "accepted", None)  # a vLLM flag of which Octavo has some values (``AcceptOnly``)
    if accepted is not None and value not in accepted:
        parser.error(f"--config: {key} {value}: {action.reason} ({', '.join(accepted)} are accepted)")
    return value
