"""Sampling defaults from a checkpoint's ``generation_config.json``
(``--generation-config``, as vLLM names it).

``auto`` takes them from the model's own file, ``vllm`` ignores the file
(Octavo's ``SamplingParams`` defaults apply), and a directory takes them from
that directory's ``generation_config.json``. Only the sampling values are
read (temperature, top_p, top_k, min_p, repetition_penalty); like vLLM,
``do_sample`` is not. A request that sets a value keeps it: the defaults fill
in only what a request leaves unset (the server's and the CLI's unset fields,
and ``LLM.generate`` called without ``SamplingParams``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from octavo.errors import InvalidArgumentError, ModelLoadError, OctavoError
from octavo.models.config import read_json

SAMPLING_KEYS: dict[str, type] = {
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "min_p": float,
    "repetition_penalty": float,
}
GENERATION_CONFIG = "generation_config.json"


def sampling_defaults(mode: str, model_dir: Path | None, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The sampling defaults ``mode`` asks for (``model_dir``: the checkpoint, None for a GGUF file),
    with ``overrides`` (``--override-generation-config``) over them."""
    return {**config_sampling_defaults(mode, model_dir), **override_sampling_defaults(overrides)}


def config_sampling_defaults(mode: str, model_dir: Path | None) -> dict[str, Any]:
    if mode == "vllm":
        return {}
    if mode == "auto":
        if model_dir is None or not (model_dir / GENERATION_CONFIG).exists():
            return {}
        source = model_dir / GENERATION_CONFIG
    else:
        source = Path(mode).expanduser() / GENERATION_CONFIG
        if not source.exists():
            raise InvalidArgumentError(
                f"--generation-config: {source} does not exist (auto, vllm, or a directory with {GENERATION_CONFIG})",
                param="generation_config",
            )
    return parse_sampling_defaults(read_json(source), source)


def parse_sampling_defaults(raw: dict[str, Any], source: Path | str) -> dict[str, Any]:
    defaults: dict[str, Any] = {}
    for key, kind in SAMPLING_KEYS.items():
        value = raw.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ModelLoadError(f"{source}: {key} must be a number, got {value!r}")
        defaults[key] = kind(value)
    from octavo.core.sampling_params import SamplingParams

    try:
        SamplingParams(**defaults)
    except OctavoError as exc:
        raise ModelLoadError(f"{source}: {exc.message}") from exc
    return defaults


def override_sampling_defaults(overrides: dict[str, Any] | None) -> dict[str, Any]:
    """``--override-generation-config``: sampling values over the config's; other keys are refused."""
    if not overrides:
        return {}
    if not isinstance(overrides, dict):
        raise InvalidArgumentError("--override-generation-config must be a JSON object", param="override_generation_config")
    unknown = sorted(set(overrides) - set(SAMPLING_KEYS))
    if unknown:
        raise InvalidArgumentError(
            f"--override-generation-config: {', '.join(unknown)} not supported (only {', '.join(SAMPLING_KEYS)})",
            param="override_generation_config",
        )
    return parse_sampling_defaults(overrides, "--override-generation-config")


def with_sampling_defaults(options: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``options`` (None meaning unset) with ``defaults`` filled in where unset; unset keys are dropped."""
    merged = dict(defaults)
    merged.update({key: value for key, value in options.items() if value is not None})
    return merged


def engine_sampling_defaults(engine: Any) -> dict[str, Any]:
    """The defaults an engine (``LLMEngine`` or ``DataParallelEngine``) was built with."""
    info = getattr(engine, "info", None)
    return dict(getattr(info, "sampling_defaults", None) or {})


def describe(defaults: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in defaults.items())
