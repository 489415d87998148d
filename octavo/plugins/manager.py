"""Loading plugins from entry points, with broken ones reported and skipped.

A plugin that fails to import, declares an incompatible API version, or whose
hook raises is recorded in ``broken_plugins()`` with its name and the error,
and skipped; startup fails only if that plugin's platform was explicitly
requested (see ``selection``). ``OCTAVO_DISABLE_PLUGIN_AUTOLOAD=1`` loads
only the built-in plugin (plus any named in ``OCTAVO_PLUGINS``, comma-separated).
"""

from __future__ import annotations

import importlib
import logging
import os
from dataclasses import dataclass
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

import pluggy

from octavo.plugins import API_VERSION, ENTRY_POINT_GROUP, PROJECT_NAME, hookspecs

logger = logging.getLogger(__name__)

BUILTIN_PLUGIN = "octavo_builtin"


@dataclass
class BrokenPlugin:
    name: str
    error: str


_manager: pluggy.PluginManager | None = None
_broken: list[BrokenPlugin] = []


def _compatible(version: Any) -> bool:
    try:
        return str(version).split(".")[0] == API_VERSION.split(".")[0]
    except Exception:
        return False


def _autoload_allowed(name: str) -> bool:
    if name == BUILTIN_PLUGIN:
        return True
    if os.environ.get("OCTAVO_DISABLE_PLUGIN_AUTOLOAD", "") not in ("", "0"):
        allowed = {n.strip() for n in os.environ.get("OCTAVO_PLUGINS", "").split(",") if n.strip()}
        return name in allowed
    return True


def register_plugin(manager: pluggy.PluginManager, name: str, module: ModuleType) -> bool:
    """Check a plugin module's API version and register it; False if refused."""
    version = getattr(module, "OCTAVO_PLUGIN_API_VERSION", None)
    if version is None or not _compatible(version):
        _broken.append(
            BrokenPlugin(name, f"plugin API version {version!r} is not compatible with Octavo's {API_VERSION}")
        )
        logger.warning("skipping plugin %s: API version %r, Octavo has %s", name, version, API_VERSION)
        return False
    try:
        manager.register(module, name=name)
    except Exception as exc:  # pluggy validates hook names and signatures
        _broken.append(BrokenPlugin(name, f"could not register: {exc}"))
        logger.warning("skipping plugin %s: %s", name, exc)
        return False
    return True


def _load_entry_points(manager: pluggy.PluginManager) -> None:
    seen_builtin = False
    for entry_point in entry_points(group=ENTRY_POINT_GROUP):
        if entry_point.name == BUILTIN_PLUGIN:
            seen_builtin = True
        if not _autoload_allowed(entry_point.name) or manager.has_plugin(entry_point.name):
            continue
        try:
            module = entry_point.load()
        except Exception as exc:
            _broken.append(BrokenPlugin(entry_point.name, f"import failed: {type(exc).__name__}: {exc}"))
            logger.warning("skipping plugin %s: import failed: %s", entry_point.name, exc)
            continue
        register_plugin(manager, entry_point.name, module)
    if not seen_builtin:
        # Running from a source tree that was never installed: register the
        # built-in plugin directly so that the CPU platform still exists.
        register_plugin(manager, BUILTIN_PLUGIN, importlib.import_module("octavo.plugins.builtin"))


class _SafeHookCaller:
    """Calls one hook on every plugin, isolating plugins whose hook raises."""

    def __init__(self, manager: pluggy.PluginManager, name: str) -> None:
        self._manager, self._name = manager, name

    def __call__(self) -> list[Any]:
        results = []
        # Built-in first, so that later plugins may override its entries.
        impls = sorted(
            getattr(self._manager.hook, self._name).get_hookimpls(),
            key=lambda impl: impl.plugin_name != BUILTIN_PLUGIN,
        )
        for impl in impls:
            try:
                results.append(impl.function())
            except Exception as exc:
                message = f"hook {self._name} raised {type(exc).__name__}: {exc}"
                if not any(b.name == impl.plugin_name and b.error == message for b in _broken):
                    _broken.append(BrokenPlugin(impl.plugin_name, message))
                    logger.warning("plugin %s: %s", impl.plugin_name, message)
        return results


class _SafeHooks:
    def __init__(self, manager: pluggy.PluginManager) -> None:
        self._manager = manager

    def __getattr__(self, name: str) -> _SafeHookCaller:
        return _SafeHookCaller(self._manager, name)


class OctavoPluginManager:
    """A pluggy manager whose ``hook.X()`` skips (and records) failing plugins."""

    def __init__(self, manager: pluggy.PluginManager) -> None:
        self.pluggy = manager
        self.hook = _SafeHooks(manager)

    def plugin_names(self) -> list[str]:
        return [name for name, _ in self.pluggy.list_name_plugin()]

    def plugin_of(self, hook_name: str, predicate) -> str | None:
        """The name of the first plugin whose ``hook_name`` result satisfies ``predicate``."""
        for impl in getattr(self.pluggy.hook, hook_name).get_hookimpls():
            try:
                if predicate(impl.function()):
                    return impl.plugin_name
            except Exception:
                continue
        return None


_wrapped: OctavoPluginManager | None = None


def get_plugin_manager() -> OctavoPluginManager:
    global _manager, _wrapped
    if _wrapped is None:
        _manager = pluggy.PluginManager(PROJECT_NAME)
        _manager.add_hookspecs(hookspecs)
        _load_entry_points(_manager)
        _wrapped = OctavoPluginManager(_manager)
    return _wrapped


def broken_plugins() -> list[BrokenPlugin]:
    get_plugin_manager()
    return list(_broken)


def reset_plugin_manager() -> None:
    """Forget loaded plugins (tests, or after installing a plugin at run time)."""
    global _manager, _wrapped
    _manager, _wrapped = None, None
    _broken.clear()
