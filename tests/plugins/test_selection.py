"""Platform selection: priority order, overrides, ties, replacement."""

from __future__ import annotations

import pytest

from octavo.errors import PlatformError
from octavo.plugins.selection import installed_platform_entries, select_platform
from tests.plugins.fake_plugins import platform_source

GOOD = 'OCTAVO_PLUGIN_API_VERSION = "1.0"\n'


def vendor(sandbox, module: str, cls: str, name: str, priority: int, available: bool = True) -> None:
    sandbox.add(
        module,
        GOOD + platform_source(cls, name, priority, available) + f"\n@hookimpl\ndef octavo_platforms():\n    return [{cls}]\n",
    )


def test_higher_priority_third_party_platform_wins(sandbox):
    vendor(sandbox, "vendor_a", "A", "accel_a", 50)
    selection = select_platform()
    assert selection.platform.name == "accel_a"
    assert selection.reason == "highest priority (50) among available platforms; also available: cpu"


def test_unavailable_platform_is_not_selected(sandbox):
    vendor(sandbox, "vendor_a", "A", "accel_a", 50, available=False)
    assert select_platform().platform.name == "cpu"


def test_two_third_party_platforms_claiming_the_machine_are_an_error(sandbox):
    vendor(sandbox, "vendor_a", "A", "accel_a", 50)
    vendor(sandbox, "vendor_b", "B", "accel_b", 50)
    with pytest.raises(PlatformError) as excinfo:
        select_platform()
    assert excinfo.value.message == (
        "platforms 'accel_a' (plugin vendor_a), 'accel_b' (plugin vendor_b) all claim this machine with "
        "priority 50; choose one with OCTAVO_PLATFORM=accel_a or OCTAVO_PLATFORM=accel_b"
    )


def test_octavo_platform_settles_a_tie(sandbox, monkeypatch):
    vendor(sandbox, "vendor_a", "A", "accel_a", 50)
    vendor(sandbox, "vendor_b", "B", "accel_b", 50)
    monkeypatch.setenv("OCTAVO_PLATFORM", "accel_b")
    selection = select_platform()
    assert selection.platform.name == "accel_b"
    assert selection.reason == "requested by OCTAVO_PLATFORM=accel_b"


def test_explicit_argument_beats_the_environment(sandbox, monkeypatch):
    vendor(sandbox, "vendor_a", "A", "accel_a", 50)
    monkeypatch.setenv("OCTAVO_PLATFORM", "accel_a")
    selection = select_platform("cpu")
    assert selection.platform.name == "cpu" and selection.reason == "requested by --platform=cpu"


def test_negative_priority_runs_only_when_requested(sandbox, monkeypatch):
    vendor(sandbox, "vendor_a", "A", "shy", -1)
    assert select_platform().platform.name == "cpu"
    monkeypatch.setenv("OCTAVO_PLATFORM", "shy")
    assert select_platform().platform.name == "shy"


def test_requesting_an_unavailable_platform_says_why(fresh_plugins, monkeypatch):
    monkeypatch.setenv("OCTAVO_PLATFORM", "tpu")
    with pytest.raises(PlatformError) as excinfo:
        select_platform()
    assert excinfo.value.message == (
        "platform 'tpu' (OCTAVO_PLATFORM) is installed but not usable here: torch_xla is not installed"
    )


def test_requesting_an_unknown_platform_lists_installed_ones(fresh_plugins):
    with pytest.raises(PlatformError) as excinfo:
        select_platform("quantum")
    assert excinfo.value.message == (
        "platform 'quantum' (--platform) is not installed (installed: cpu, cuda, hpu, npu, rocm, tpu, xpu)"
    )


def test_a_plugin_may_replace_a_builtin_platform(sandbox):
    vendor(sandbox, "better_cpu", "BetterCpu", "cpu", 0)
    entries = installed_platform_entries()
    assert entries["cpu"].plugin == "better_cpu" and entries["cpu"].replaced == ["octavo_builtin"]
    selection = select_platform()
    assert type(selection.platform).__name__ == "BetterCpu"
    assert next(c for c in selection.candidates if c.name == "cpu").replaced == ["octavo_builtin"]


def test_candidates_are_listed_by_priority(fresh_plugins):
    names = [c.name for c in select_platform().candidates]
    assert names == ["cuda", "rocm", "hpu", "npu", "tpu", "xpu", "cpu"]
