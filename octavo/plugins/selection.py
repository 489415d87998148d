"""Choosing the one platform this process runs on.

1. A platform asked for by name (``--platform``, else ``OCTAVO_PLATFORM``)
   wins if it is installed and its probe says it is available; otherwise
   startup fails, naming broken plugins that might have provided it.
2. Otherwise every installed platform's cheap ``is_available()`` probe runs;
   among the available ones with ``priority >= 0`` the highest priority wins.
   Built-in priorities: cuda 100, rocm 95, hpu 90, npu 85, tpu 80, xpu 70,
   cpu 0, so with no accelerator the cpu wins.
3. Two or more available platforms sharing the top priority (say, two
   vendors' plugins claiming the same machine) are an error that names them
   and their plugins; ``OCTAVO_PLATFORM`` settles it.

Before any of this, a plugin named in ``OCTAVO_PLUGINS`` that is broken
fails startup (``require_requested_plugins``). A platform class that a hook
returns but that does not implement the interface, or whose probe raises,
marks its plugin broken and is skipped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from octavo.errors import PlatformError
from octavo.platforms.interface import Platform
from octavo.plugins.manager import (
    broken_plugins_hint,
    get_plugin_manager,
    record_broken,
    require_requested_plugins,
)


@dataclass
class Candidate:
    name: str
    plugin: str
    priority: int
    available: bool
    detail: str
    replaced: list[str] = field(default_factory=list)  # plugins whose same-named platform this one replaced


@dataclass
class PlatformSelection:
    platform: Platform
    reason: str
    candidates: list[Candidate] = field(default_factory=list)


@dataclass
class InstalledPlatform:
    cls: type[Platform]
    plugin: str
    replaced: list[str] = field(default_factory=list)


def platform_class_problem(cls: object) -> str | None:
    """Why ``cls`` is not a usable Platform class, or None."""
    if not (isinstance(cls, type) and issubclass(cls, Platform)):
        return f"{cls!r} is not a subclass of octavo.platforms.Platform"
    for attribute in ("name", "device_type", "dist_backend"):
        if not isinstance(getattr(cls, attribute, None), str):
            return f"platform {cls.__name__} has no string {attribute!r}"
    if getattr(cls, "__abstractmethods__", None):
        return f"platform {cls.__name__} does not implement {', '.join(sorted(cls.__abstractmethods__))}"
    if not isinstance(cls.priority, int):
        return f"platform {cls.__name__} has a non-integer priority {cls.priority!r}"
    return None


def installed_platform_entries() -> dict[str, InstalledPlatform]:
    """Every loaded plugin's platforms by name, later plugins replacing earlier ones."""
    installed: dict[str, InstalledPlatform] = {}
    for plugin, classes in get_plugin_manager().hook.octavo_platforms.with_plugin_names():
        for cls in classes or []:
            problem = platform_class_problem(cls)
            if problem is not None:
                record_broken(plugin, problem)
                continue
            previous = installed.get(cls.name)
            replaced = previous.replaced + [previous.plugin] if previous else []
            installed[cls.name] = InstalledPlatform(cls, plugin, replaced)
    return installed


def installed_platforms() -> dict[str, tuple[type[Platform], str]]:
    """``{name: (class, plugin name)}`` from every loaded plugin."""
    return {name: (entry.cls, entry.plugin) for name, entry in installed_platform_entries().items()}


def _probe(entry: InstalledPlatform) -> tuple[bool, str]:
    try:
        available = bool(entry.cls.is_available())
        return available, entry.cls.availability_detail()
    except Exception as exc:
        problem = f"platform {entry.cls.name}: probe raised {type(exc).__name__}: {exc}"
        record_broken(entry.plugin, problem)
        return False, problem


def probe_candidates(installed: dict[str, InstalledPlatform]) -> list[Candidate]:
    candidates = []
    for name, entry in installed.items():
        available, detail = _probe(entry)
        candidates.append(Candidate(name, entry.plugin, entry.cls.priority, available, detail, entry.replaced))
    return sorted(candidates, key=lambda c: (-c.priority, c.name))


def select_platform(requested: str | None = None) -> PlatformSelection:
    """The platform for this process, by the rules in this module's docstring."""
    require_requested_plugins()
    installed = installed_platform_entries()
    candidates = probe_candidates(installed)
    if requested:
        return _select_requested(requested, "--platform", installed, candidates)
    if os.environ.get("OCTAVO_PLATFORM"):
        return _select_requested(os.environ["OCTAVO_PLATFORM"], "OCTAVO_PLATFORM", installed, candidates)
    eligible = [c for c in candidates if c.available and c.priority >= 0]
    if not eligible:
        raise PlatformError("no platform is available (not even cpu: is the built-in plugin installed?)")
    top = max(c.priority for c in eligible)
    winners = [c for c in eligible if c.priority == top]
    if len(winners) > 1:
        claims = ", ".join(f"{c.name!r} (plugin {c.plugin})" for c in winners)
        choices = " or ".join(f"OCTAVO_PLATFORM={c.name}" for c in winners)
        raise PlatformError(
            f"platforms {claims} all claim this machine with priority {top}; choose one with {choices}"
        )
    winner = winners[0]
    reason = f"highest priority ({winner.priority}) among available platforms"
    others = [c.name for c in eligible if c is not winner]
    if others:
        reason += f"; also available: {', '.join(others)}"
    return PlatformSelection(installed[winner.name].cls(), reason, candidates)


def _select_requested(
    requested: str, source: str, installed: dict[str, InstalledPlatform], candidates: list[Candidate]
) -> PlatformSelection:
    if requested not in installed:
        names = ", ".join(sorted(installed)) or "none"
        hint = broken_plugins_hint()
        raise PlatformError(f"platform {requested!r} ({source}) is not installed (installed: {names}){hint}")
    candidate = next(c for c in candidates if c.name == requested)
    if not candidate.available:
        raise PlatformError(f"platform {requested!r} ({source}) is installed but not usable here: {candidate.detail}")
    return PlatformSelection(installed[requested].cls(), f"requested by {source}={requested}", candidates)
