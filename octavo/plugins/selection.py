"""Choosing the one platform this process runs on.

Order: ``OCTAVO_PLATFORM`` (or an explicit request) wins if that platform is
installed and available; otherwise every installed platform's cheap
``is_available()`` probe runs and the highest ``priority`` wins. Two
available platforms of equal top priority are an error (say which one with
``OCTAVO_PLATFORM``); cpu, at priority 0, is the floor.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from octavo.errors import PlatformError
from octavo.platforms.interface import Platform
from octavo.plugins.manager import broken_plugins, get_plugin_manager


@dataclass
class Candidate:
    name: str
    plugin: str
    priority: int
    available: bool
    detail: str


@dataclass
class PlatformSelection:
    platform: Platform
    reason: str
    candidates: list[Candidate] = field(default_factory=list)


def installed_platforms() -> dict[str, tuple[type[Platform], str]]:
    """``{name: (class, plugin name)}`` from every loaded plugin."""
    manager = get_plugin_manager()
    platforms: dict[str, tuple[type[Platform], str]] = {}
    for impl in sorted(
        manager.pluggy.hook.octavo_platforms.get_hookimpls(), key=lambda i: i.plugin_name != "octavo_builtin"
    ):
        for cls in _platforms_of(impl):
            platforms[cls.name] = (cls, impl.plugin_name)
    return platforms


def _platforms_of(impl) -> list[type[Platform]]:
    try:
        return list(impl.function() or [])
    except Exception:
        return []  # recorded as broken by the safe hook caller


def _probe(cls: type[Platform]) -> tuple[bool, str]:
    try:
        available = bool(cls.is_available())
        return available, cls.availability_detail()
    except Exception as exc:
        return False, f"probe failed: {type(exc).__name__}: {exc}"


def select_platform(requested: str | None = None) -> PlatformSelection:
    get_plugin_manager().hook.octavo_platforms()  # records plugins whose hook raises
    platforms = installed_platforms()
    candidates = []
    for name, (cls, plugin) in platforms.items():
        available, detail = _probe(cls)
        candidates.append(Candidate(name, plugin, cls.priority, available, detail))
    requested = requested or os.environ.get("OCTAVO_PLATFORM") or None
    if requested:
        return _select_requested(requested, platforms, candidates)
    available = [c for c in candidates if c.available]
    if not available:
        raise PlatformError("no platform is available (not even cpu: is the built-in plugin installed?)")
    top = max(c.priority for c in available)
    winners = [c for c in available if c.priority == top]
    if len(winners) > 1:
        names = ", ".join(sorted(c.name for c in winners))
        raise PlatformError(
            f"several platforms claim this machine with the same priority ({names}); "
            "choose one with OCTAVO_PLATFORM=<name>"
        )
    winner = winners[0]
    others = [c.name for c in available if c is not winner]
    reason = f"highest priority ({winner.priority}) among available platforms"
    if others:
        reason += f" (also available: {', '.join(others)})"
    return PlatformSelection(platforms[winner.name][0](), reason, candidates)


def _select_requested(requested: str, platforms, candidates: list[Candidate]) -> PlatformSelection:
    if requested not in platforms:
        installed = ", ".join(sorted(platforms)) or "none"
        broken = [b for b in broken_plugins() if requested in b.name or requested in b.error]
        hint = f"; plugin {broken[0].name} failed to load: {broken[0].error}" if broken else ""
        raise PlatformError(f"platform {requested!r} is not installed (installed: {installed}){hint}")
    candidate = next(c for c in candidates if c.name == requested)
    if not candidate.available:
        raise PlatformError(f"platform {requested!r} is installed but not usable here: {candidate.detail}")
    return PlatformSelection(platforms[requested][0](), f"requested ({requested})", candidates)
