"""Loading plugins from entry points, with broken ones reported and skipped.

Order: the built-in plugin first, then every other entry point of the
``octavo.plugins`` group sorted by name, then modules named in
``OCTAVO_PLUGINS`` that have no entry point. A later plugin's entries
replace an earlier one's on a name clash.

A plugin is *broken*, recorded in ``broken_plugins()`` with its name and
the error, and unregistered (none of its hooks run again) when:

* its module fails to import;
* it declares no ``OCTAVO_PLUGIN_API_VERSION`` or an incompatible one
  (another major version, or a newer minor version than Octavo's);
* it implements a hook that does not exist (a typo) or with wrong arguments,
  or one newer than the API version it declares (``octavo_layer_ops`` needs
  1.1);
* one of its hooks raises or returns the wrong kind of value when the
  plugin is loaded (every hook is called once then, to find out), e.g. a
  layer-op entry that is malformed or names an op that does not exist.

A hook that raises later, or a platform whose probe raises, is recorded the
same way and its result skipped. Loading never fails because of a broken
plugin: ``require_requested_plugins`` fails startup only for plugins the user
asked for by name (``OCTAVO_PLUGINS``), and selection fails only when the
platform asked for is missing (see ``selection``).

``OCTAVO_DISABLE_PLUGIN_AUTOLOAD=1`` loads only the built-in plugin plus the
plugins named in ``OCTAVO_PLUGINS`` (entry-point names or module names,
comma-separated).
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
BUILTIN_MODULE = "octavo.plugins.builtin"
# What each hook must return (besides None).
HOOK_RESULT_TYPES: dict[str, tuple[type, ...]] = {
    "octavo_platforms": (list, tuple),
    "octavo_models": (dict,),
    "octavo_quantization_methods": (dict,),
    "octavo_attention_backends": (dict,),
    "octavo_layer_ops": (list, tuple),
}
# Hooks added after 1.0, and the plugin API version that added each.
HOOK_SINCE: dict[str, tuple[int, int]] = {"octavo_layer_ops": (1, 1)}


@dataclass(frozen=True)
class BrokenPlugin:
    name: str
    error: str


_manager: pluggy.PluginManager | None = None
_wrapped: OctavoPluginManager | None = None
_broken: list[BrokenPlugin] = []


def record_broken(name: str, error: str) -> None:
    """Record (once) that plugin ``name`` is broken, and log it."""
    entry = BrokenPlugin(name, error)
    if entry not in _broken:
        _broken.append(entry)
        logger.warning("plugin %s is broken and skipped: %s", name, error)


def parse_version(version: Any) -> tuple[int, int]:
    """``"1.1"`` -> ``(1, 1)``; ValueError if not of the form MAJOR.MINOR."""
    major, minor = (int(part) for part in str(version).split("."))
    return major, minor


def version_problem(version: Any) -> str | None:
    """Why a plugin declaring API ``version`` cannot load, or None if it can."""
    if version is None:
        return f"it declares no OCTAVO_PLUGIN_API_VERSION (Octavo's plugin API is {API_VERSION})"
    try:
        major, minor = parse_version(version)
    except ValueError:
        return f"OCTAVO_PLUGIN_API_VERSION {version!r} is not of the form 'MAJOR.MINOR'"
    our_major, our_minor = parse_version(API_VERSION)
    if major != our_major or minor > our_minor:
        return f"it was written for plugin API {version}, Octavo's is {API_VERSION}"
    return None


def requested_plugin_names() -> list[str]:
    """Plugins the user asked for by name (``OCTAVO_PLUGINS``)."""
    return [name.strip() for name in os.environ.get("OCTAVO_PLUGINS", "").split(",") if name.strip()]


def autoload_disabled() -> bool:
    return os.environ.get("OCTAVO_DISABLE_PLUGIN_AUTOLOAD", "") not in ("", "0")


def _check_hooks(manager: pluggy.PluginManager, name: str, module: ModuleType) -> str | None:
    for impl_name in dir(module):
        if not impl_name.startswith("octavo_"):
            continue
        hook = getattr(manager.hook, impl_name, None)
        if hook is None or not hook.has_spec():
            if manager.parse_hookimpl_opts(module, impl_name) is not None:
                return f"it implements unknown hook {impl_name!r} (known: {', '.join(sorted(HOOK_RESULT_TYPES))})"
    declared = parse_version(module.OCTAVO_PLUGIN_API_VERSION)
    for hook_name, since in HOOK_SINCE.items():
        implemented = any(i.plugin_name == name for i in getattr(manager.hook, hook_name).get_hookimpls())
        if implemented and declared < since:
            return (
                f"it implements {hook_name}, new in plugin API {since[0]}.{since[1]}, but declares "
                f"OCTAVO_PLUGIN_API_VERSION {module.OCTAVO_PLUGIN_API_VERSION}"
            )
    for hook_name in HOOK_RESULT_TYPES:
        for impl in getattr(manager.hook, hook_name).get_hookimpls():
            if impl.plugin_name == name:
                problem = call_hookimpl(impl, hook_name, declared)[1]
                if problem is not None:
                    return problem
    return None


def call_hookimpl(
    impl: Any, hook_name: str, declared: tuple[int, int] | None = None
) -> tuple[Any, str | None]:
    """``(result, None)``, or ``(None, problem)`` when the hook raised or returned
    the wrong type (or, given the plugin's ``declared`` API version, layer ops newer than it)."""
    try:
        result = impl.function()
    except Exception as exc:
        return None, f"hook {hook_name} raised {type(exc).__name__}: {exc}"
    expected = HOOK_RESULT_TYPES.get(hook_name)
    if result is not None and expected is not None and not isinstance(result, expected):
        kinds = " or ".join(t.__name__ for t in expected)
        return None, f"hook {hook_name} returned {type(result).__name__}, expected {kinds} or None"
    if result is not None and hook_name == "octavo_layer_ops":
        problem = _layer_ops_problem(result, declared)
        if problem is not None:
            return None, f"hook {hook_name}: {problem}"
    return result, None


def _layer_ops_problem(entries: list | tuple, declared: tuple[int, int] | None) -> str | None:
    from octavo.ops.impl import OpImpl
    from octavo.ops.specs import OP_SPECS

    for entry in entries:
        if not isinstance(entry, OpImpl):
            return f"an entry is a {type(entry).__name__}, expected octavo.ops.OpImpl"
        problem = entry.problem()
        if problem is not None:
            return problem
        since = OP_SPECS[entry.op].since
        if declared is not None and declared < since:
            return (
                f"{entry.label}: layer op {entry.op!r} is new in plugin API {since[0]}.{since[1]}, but the plugin "
                f"declares OCTAVO_PLUGIN_API_VERSION {declared[0]}.{declared[1]}"
            )
    return None


def register_plugin(manager: pluggy.PluginManager, name: str, module: ModuleType) -> bool:
    """Check a plugin module and register it under ``name``; False (and recorded) if refused."""
    problem = version_problem(getattr(module, "OCTAVO_PLUGIN_API_VERSION", None))
    if problem is None:
        try:
            manager.register(module, name=name)
        except Exception as exc:  # pluggy checks hook arguments against the specs
            problem = f"could not register: {exc}"
        else:
            problem = _check_hooks(manager, name, module)
            if problem is not None:
                manager.unregister(name=name)
    if problem is not None:
        record_broken(name, problem)
        return False
    return True


def _import_and_register(manager: pluggy.PluginManager, name: str, load) -> None:
    try:
        module = load()
    except Exception as exc:
        record_broken(name, f"import failed: {type(exc).__name__}: {exc}")
        return
    if manager.is_registered(module):
        return  # named in OCTAVO_PLUGINS by module, and already loaded through its entry point
    register_plugin(manager, name, module)


def _load_plugins(manager: pluggy.PluginManager) -> None:
    found = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    builtin = found.pop(BUILTIN_PLUGIN, None)
    # From a source tree that was never installed there is no entry point:
    # import the built-in plugin directly so that the cpu platform exists.
    load_builtin = builtin.load if builtin else lambda: importlib.import_module(BUILTIN_MODULE)
    _import_and_register(manager, BUILTIN_PLUGIN, load_builtin)
    requested = requested_plugin_names()
    for name in sorted(found):
        if autoload_disabled() and name not in requested:
            continue
        _import_and_register(manager, name, found[name].load)
    for name in requested:
        if name not in found and not manager.has_plugin(name):
            _import_and_register(manager, name, lambda name=name: importlib.import_module(name))


class _SafeHookCaller:
    """Calls one hook on every plugin, in load order, skipping (and recording) failures."""

    def __init__(self, manager: pluggy.PluginManager, name: str) -> None:
        self._manager, self._name = manager, name

    def with_plugin_names(self) -> list[tuple[str, Any]]:
        """``[(plugin name, result)]`` for every plugin whose hook worked."""
        order = {name: index for index, (name, _) in enumerate(self._manager.list_name_plugin())}
        impls = sorted(getattr(self._manager.hook, self._name).get_hookimpls(), key=lambda i: order[i.plugin_name])
        results = []
        for impl in impls:
            result, problem = call_hookimpl(impl, self._name)
            if problem is not None:
                record_broken(impl.plugin_name, problem)
                continue
            results.append((impl.plugin_name, result))
        return results

    def __call__(self) -> list[Any]:
        return [result for _, result in self.with_plugin_names()]


class _SafeHooks:
    def __init__(self, manager: pluggy.PluginManager) -> None:
        self._manager = manager

    def __getattr__(self, name: str) -> _SafeHookCaller:
        if name not in HOOK_RESULT_TYPES:
            raise AttributeError(f"no hook named {name!r}")
        return _SafeHookCaller(self._manager, name)


class OctavoPluginManager:
    """A pluggy manager whose ``hook.X()`` skips (and records) failing plugins."""

    def __init__(self, manager: pluggy.PluginManager) -> None:
        self.pluggy = manager
        self.hook = _SafeHooks(manager)

    def plugin_names(self) -> list[str]:
        return [name for name, _ in self.pluggy.list_name_plugin()]

    def plugin_module(self, name: str) -> ModuleType | None:
        return self.pluggy.get_plugin(name)


def get_plugin_manager() -> OctavoPluginManager:
    """The process-wide manager; plugins are loaded on the first call."""
    global _manager, _wrapped
    if _wrapped is None:
        _manager = pluggy.PluginManager(PROJECT_NAME)
        _manager.add_hookspecs(hookspecs)
        _load_plugins(_manager)
        _wrapped = OctavoPluginManager(_manager)
    return _wrapped


def broken_plugins() -> list[BrokenPlugin]:
    get_plugin_manager()
    return list(_broken)


def require_requested_plugins() -> None:
    """Fail startup if a plugin named in ``OCTAVO_PLUGINS`` is broken or missing."""
    from octavo.errors import PluginError

    manager = get_plugin_manager()
    for name in requested_plugin_names():
        broken = [b for b in _broken if b.name == name]
        if broken:
            raise PluginError(f"plugin {name!r} (requested in OCTAVO_PLUGINS) is broken: {broken[0].error}")
        # A plugin may be named by entry point or by module.
        loaded = set(manager.plugin_names()) | {manager.plugin_module(n).__name__ for n in manager.plugin_names()}
        if name not in loaded:
            raise PluginError(f"plugin {name!r} (requested in OCTAVO_PLUGINS) is not installed")


def broken_plugins_hint() -> str:
    """``"; broken plugins: a (why), b (why)"`` or ``""``: for "X not found" errors."""
    broken = broken_plugins()
    if not broken:
        return ""
    return "; broken plugins that may have provided it: " + ", ".join(f"{b.name} ({b.error})" for b in broken)


def reset_plugin_manager() -> None:
    """Forget loaded plugins (tests, or after installing a plugin at run time)."""
    global _manager, _wrapped
    _manager, _wrapped = None, None
    _broken.clear()
