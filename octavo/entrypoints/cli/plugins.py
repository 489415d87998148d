"""``octavo plugins list`` and ``octavo plugins check NAME`` (the conformance suite)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub) -> None:
    parser = sub.add_parser("plugins", help="list plugins, or check a platform with the conformance suite")
    commands = parser.add_subparsers(dest="plugins_command", required=True)
    listing = commands.add_parser("list", help="loaded plugins and what each one provides")
    listing.set_defaults(func=run_list)
    check = commands.add_parser(
        "check", help="run the conformance suite against platform NAME (and every plugin's ops, methods, models)"
    )
    check.add_argument("name", help="platform name, e.g. cpu, cuda, example")
    check.add_argument(
        "--only",
        default=None,
        help="comma-separated checks to run (interface, kv_cache, attention, fused_rotary, ops, quantization, "
        "model, plugin_models, two_devices)",
    )
    check.add_argument("--workdir", default=None, help="keep the tiny checkpoint here instead of a temp dir")
    check.set_defaults(func=run_check)


def describe_plugins() -> str:
    from octavo.plugins.manager import broken_plugins, get_plugin_manager
    from octavo.plugins.selection import installed_platform_entries

    manager = get_plugin_manager()
    lines = ["plugins:"]
    for name in manager.plugin_names():
        module = manager.plugin_module(name)
        version = getattr(module, "OCTAVO_PLUGIN_API_VERSION", "?")
        lines.append(f"  {name} ({getattr(module, '__name__', module)}, plugin API {version})")
    for broken in broken_plugins():
        lines.append(f"  BROKEN {broken.name}: {broken.error}")
    lines.append("platforms:")
    for name, entry in installed_platform_entries().items():
        replaced = f", replaces {', '.join(entry.replaced)}'s" if entry.replaced else ""
        lines.append(f"  {name} [{entry.plugin}{replaced}] priority {entry.cls.priority}")
    for hook, title in (
        ("octavo_attention_backends", "attention backends"),
        ("octavo_quantization_methods", "quantization methods"),
        ("octavo_models", "models"),
    ):
        lines.append(f"{title}:")
        for plugin, result in getattr(manager.hook, hook).with_plugin_names():
            if result:
                lines.append(f"  [{plugin}] {', '.join(sorted(result))}")
    lines.append("layer ops (op=implementation, for platforms / device types):")
    for plugin, impls in manager.hook.octavo_layer_ops.with_plugin_names():
        if impls:
            lines.append(f"  [{plugin}] " + ", ".join(f"{impl.label}{_where(impl)}" for impl in impls))
    return "\n".join(lines)


def _where(impl) -> str:
    where = ", ".join(impl.platforms + impl.device_types)
    return f" ({where})" if where else ""


def run_list(args: argparse.Namespace) -> int:
    print(describe_plugins())
    return 0


def run_check(args: argparse.Namespace) -> int:
    from octavo.testing.conformance import run_conformance
    from octavo.testing.conformance.checks import CHECKS

    only = [c.strip() for c in args.only.split(",")] if args.only else None
    unknown = [c for c in only or [] if c not in CHECKS]
    if unknown:
        print(f"error: unknown check(s) {', '.join(unknown)} (known: {', '.join(CHECKS)})", file=sys.stderr)
        return 2
    print(f"octavo conformance suite, platform {args.name}")
    results = run_conformance(args.name, only, Path(args.workdir) if args.workdir else None)
    for result in results:
        print(f"  {result.status.upper():<7} {result.name:<10} {result.detail}")
    failed = [r.name for r in results if r.status == "failed"]
    passed = sum(r.status == "passed" for r in results)
    skipped = sum(r.status == "skipped" for r in results)
    print(f"{passed} passed, {skipped} skipped, {len(failed)} failed")
    return 1 if failed else 0
