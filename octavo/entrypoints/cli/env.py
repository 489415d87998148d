"""``octavo env``: platforms found, the one selected and why, plugins, versions."""

from __future__ import annotations

import argparse
import platform as host


def add_parser(sub) -> None:
    parser = sub.add_parser("env", help="show platforms, plugins and versions")
    parser.add_argument("--platform", default=None, help="explain selecting this platform")
    parser.add_argument("--model", "-m", default=None, help="also report this model's weight memory")
    parser.add_argument("--quantization", "-q", default=None, help="with --model: quantize as when serving")
    parser.add_argument("--dtype", default="bfloat16", help="with --model: the model dtype (default bfloat16)")
    parser.set_defaults(func=run)


def describe(requested: str | None = None) -> str:
    from octavo.errors import PlatformError
    from octavo.plugins import API_VERSION
    from octavo.plugins.manager import broken_plugins, get_plugin_manager
    from octavo.plugins.selection import installed_platforms, select_platform
    from octavo.version import __version__

    lines = [f"octavo {__version__} (plugin API {API_VERSION})", f"python {host.python_version()} on {host.platform()}"]
    for package in ("torch", "transformers", "tokenizers", "triton", "pluggy", "safetensors"):
        lines.append(f"  {package}: {_version(package)}")
    lines.append("plugins: " + ", ".join(get_plugin_manager().plugin_names()))
    for broken in broken_plugins():
        lines.append(f"  broken plugin {broken.name}: {broken.error}")
    lines.append("platforms:")
    try:
        selection = select_platform(requested)
        for candidate in selection.candidates:
            mark = "*" if candidate.name == selection.platform.name else " "
            state = "available" if candidate.available else "unavailable"
            lines.append(
                f" {mark} {candidate.name:<6} priority {candidate.priority:>3}  {state:<11} "
                f"[{candidate.plugin}] {candidate.detail}"
            )
        lines.append(f"selected: {selection.platform.name} ({selection.reason})")
        for key, value in selection.platform.versions().items():
            lines.append(f"  {key}: {value}")
    except PlatformError as exc:
        for name, (cls, plugin) in installed_platforms().items():
            lines.append(f"   {name:<6} priority {cls.priority:>3}  [{plugin}]")
        lines.append(f"selected: none ({exc.message})")
    return "\n".join(lines)


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def run(args: argparse.Namespace) -> int:
    print(describe(args.platform))
    if args.model is not None:
        from octavo.quantization.memory import measure_weight_memory

        memory = measure_weight_memory(args.model, args.quantization, args.dtype)
        print(f"model {args.model}: {memory.describe(args.quantization)}")
    return 0
