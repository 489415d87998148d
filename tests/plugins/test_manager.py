"""Plugin loading: broken plugins are reported by name and skipped; startup
fails only for a plugin that was asked for by name; autoload can be turned off."""

from __future__ import annotations

import pytest

from octavo.errors import PlatformError, PluginError
from octavo.plugins import API_VERSION
from octavo.plugins.manager import broken_plugins, get_plugin_manager, version_problem
from octavo.plugins.selection import installed_platforms, select_platform
from tests.plugins.fake_plugins import platform_source

GOOD = 'OCTAVO_PLUGIN_API_VERSION = "1.0"\n'


def broken_by_name() -> dict[str, str]:
    return {b.name: b.error for b in broken_plugins()}


def test_builtin_plugin_is_loaded_and_cpu_selected(fresh_plugins):
    assert "octavo_builtin" in get_plugin_manager().plugin_names()
    selection = select_platform()
    assert selection.platform.name == "cpu"
    assert selection.reason.startswith("highest priority (0)")
    assert broken_by_name() == {}


def test_import_error_is_reported_and_skipped(sandbox):
    sandbox.add("bad_import", "import no_such_vendor_package\n", header=False)
    sandbox.add("good_one", GOOD + platform_source("Good", "good", -5) + "\n@hookimpl\ndef octavo_platforms():\n    return [Good]\n")
    platforms = installed_platforms()
    assert "good" in platforms and "cpu" in platforms
    error = broken_by_name()["bad_import"]
    assert error == "import failed: ModuleNotFoundError: No module named 'no_such_vendor_package'"
    assert select_platform().platform.name == "cpu"


@pytest.mark.parametrize(
    "declaration, expected",
    [
        ("", "it declares no OCTAVO_PLUGIN_API_VERSION (Octavo's plugin API is 1.7)"),
        ('OCTAVO_PLUGIN_API_VERSION = "2.0"\n', "it was written for plugin API 2.0, Octavo's is 1.7"),
        ('OCTAVO_PLUGIN_API_VERSION = "1.9"\n', "it was written for plugin API 1.9, Octavo's is 1.7"),
        ('OCTAVO_PLUGIN_API_VERSION = "one"\n', "OCTAVO_PLUGIN_API_VERSION 'one' is not of the form 'MAJOR.MINOR'"),
    ],
)
def test_incompatible_api_version_is_reported_and_skipped(sandbox, declaration, expected):
    sandbox.add("versioned", declaration + platform_source("V", "versioned") + "\n@hookimpl\ndef octavo_platforms():\n    return [V]\n")
    assert broken_by_name() == {"versioned": expected}
    assert "versioned" not in installed_platforms()
    assert "versioned" not in get_plugin_manager().plugin_names()


def test_older_minor_version_is_accepted():
    assert version_problem(API_VERSION) is None
    assert version_problem("1.0") is None


def test_hook_that_raises_marks_the_whole_plugin_broken(sandbox):
    sandbox.add(
        "raising",
        GOOD
        + platform_source("R", "raising_platform")
        + """
@hookimpl
def octavo_platforms():
    return [R]

@hookimpl
def octavo_models():
    raise RuntimeError("vendor bug")
""",
    )
    assert broken_by_name() == {"raising": "hook octavo_models raised RuntimeError: vendor bug"}
    # None of its hooks run any more: its platform is gone too.
    assert "raising_platform" not in installed_platforms()
    assert select_platform().platform.name == "cpu"


def test_hook_returning_the_wrong_type_is_reported(sandbox):
    sandbox.add("wrong_type", GOOD + "@hookimpl\ndef octavo_models():\n    return ['LlamaForCausalLM']\n")
    assert broken_by_name() == {"wrong_type": "hook octavo_models returned list, expected dict or None"}


def test_misspelled_hook_is_reported(sandbox):
    sandbox.add("typo", GOOD + "@hookimpl\ndef octavo_platfroms():\n    return []\n")
    error = broken_by_name()["typo"]
    assert error.startswith("it implements unknown hook 'octavo_platfroms'")


def test_hook_with_unknown_arguments_is_reported(sandbox):
    sandbox.add("bad_args", GOOD + "@hookimpl\ndef octavo_platforms(config):\n    return []\n")
    error = broken_by_name()["bad_args"]
    assert error.startswith("could not register:") and "config" in error


def test_a_non_platform_class_is_reported(sandbox):
    sandbox.add("not_platform", GOOD + "class X:\n    name = 'x'\n\n@hookimpl\ndef octavo_platforms():\n    return [X]\n")
    assert "x" not in installed_platforms()
    assert "is not a subclass of octavo.platforms.Platform" in broken_by_name()["not_platform"]


def test_a_probe_that_raises_is_reported_and_unavailable(sandbox):
    source = platform_source("P", "probing").replace("return True", "raise OSError('driver missing')")
    sandbox.add("probing", GOOD + source + "\n@hookimpl\ndef octavo_platforms():\n    return [P]\n")
    selection = select_platform()
    assert selection.platform.name == "cpu"
    candidate = next(c for c in selection.candidates if c.name == "probing")
    assert not candidate.available
    assert broken_by_name()["probing"] == "platform probing: probe raised OSError: driver missing"


def test_a_hook_that_fails_later_is_skipped_then(sandbox):
    sandbox.add(
        "flaky",
        GOOD
        + """
calls = []

@hookimpl
def octavo_models():
    calls.append(1)
    if len(calls) > 1:
        raise ValueError("second call")
    return {}
""",
    )
    manager = get_plugin_manager()
    assert broken_by_name() == {}
    assert manager.hook.octavo_models() is not None  # the built-in's result still comes back
    assert broken_by_name() == {"flaky": "hook octavo_models raised ValueError: second call"}


def test_broken_plugin_named_in_octavo_plugins_fails_startup(sandbox, monkeypatch):
    sandbox.add("wanted", "raise ImportError('missing libvendor.so')\n", header=False)
    monkeypatch.setenv("OCTAVO_PLUGINS", "wanted")
    with pytest.raises(PluginError) as excinfo:
        select_platform()
    assert excinfo.value.message == (
        "plugin 'wanted' (requested in OCTAVO_PLUGINS) is broken: import failed: ImportError: missing libvendor.so"
    )


def test_requested_platform_of_a_broken_plugin_names_it(sandbox, monkeypatch):
    sandbox.add("vendor_x", "raise ImportError('missing libvendor.so')\n", header=False)
    monkeypatch.setenv("OCTAVO_PLATFORM", "vendor_x")
    with pytest.raises(PlatformError) as excinfo:
        select_platform()
    message = excinfo.value.message
    assert message.startswith("platform 'vendor_x' (OCTAVO_PLATFORM) is not installed (installed: cpu, cuda, ")
    assert message.endswith(
        "broken plugins that may have provided it: vendor_x (import failed: ImportError: missing libvendor.so)"
    )


def test_missing_plugin_named_in_octavo_plugins_fails_startup(fresh_plugins, monkeypatch):
    monkeypatch.setenv("OCTAVO_PLUGINS", "no_such_plugin_module")
    with pytest.raises(PluginError, match="plugin 'no_such_plugin_module' .* is broken: import failed"):
        select_platform()


def test_disable_autoload_keeps_builtin_and_named_plugins(sandbox, monkeypatch):
    sandbox.add("auto_a", GOOD + platform_source("A", "plat_a", -1) + "\n@hookimpl\ndef octavo_platforms():\n    return [A]\n")
    sandbox.add("auto_b", GOOD + platform_source("B", "plat_b", -1) + "\n@hookimpl\ndef octavo_platforms():\n    return [B]\n")
    monkeypatch.setenv("OCTAVO_DISABLE_PLUGIN_AUTOLOAD", "1")
    names = get_plugin_manager().plugin_names()
    assert "octavo_builtin" in names and "auto_a" not in names and "auto_b" not in names

    from octavo.plugins.manager import reset_plugin_manager

    reset_plugin_manager()
    monkeypatch.setenv("OCTAVO_PLUGINS", "auto_b")
    names = get_plugin_manager().plugin_names()
    assert names[0] == "octavo_builtin" and "auto_b" in names and "auto_a" not in names
    assert set(installed_platforms()) >= {"cpu", "plat_b"}


def test_octavo_plugins_can_name_a_module_without_entry_point(sandbox, monkeypatch):
    sandbox.add("dev_plugin", GOOD + platform_source("D", "dev", -1) + "\n@hookimpl\ndef octavo_platforms():\n    return [D]\n", entry_point=False)
    assert "dev" not in installed_platforms()
    from octavo.plugins.manager import reset_plugin_manager

    reset_plugin_manager()
    monkeypatch.setenv("OCTAVO_PLUGINS", "dev_plugin")
    assert installed_platforms()["dev"][1] == "dev_plugin"


def test_builtin_plugin_loads_from_an_uninstalled_source_tree(fresh_plugins, monkeypatch):
    from octavo.plugins import manager

    monkeypatch.setattr(manager, "entry_points", lambda group: [])
    assert get_plugin_manager().plugin_names() == ["octavo_builtin"]
    assert select_platform().platform.name == "cpu"
