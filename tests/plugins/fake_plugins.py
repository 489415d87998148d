"""Writing throwaway plugin modules and entry points for tests.

In a sandbox, the ``octavo.plugins`` entry points are the built-in one plus
those a test adds, whatever else is installed (the example plugin, say).
``PluginSandbox.add(name, source)`` writes ``source`` as module ``name`` in a
temporary directory on ``sys.path`` and registers an entry point ``name``.
The plugin manager is reset before and after, and the ``OCTAVO_*`` variables
are cleared, so every test loads plugins afresh.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from octavo.plugins import ENTRY_POINT_GROUP, manager

HEADER = """
import torch
from octavo.plugins import hookimpl
from octavo.platforms import MemoryInfo, Platform
"""

PLATFORM_TEMPLATE = """
class {cls}(Platform):
    name = {name!r}
    device_type = "cpu"
    dist_backend = "gloo"
    priority = {priority}

    @classmethod
    def is_available(cls):
        return {available}

    def device_count(self):
        return 1

    def device(self, index=0):
        return torch.device("cpu")

    def memory_info(self, index=0):
        return MemoryInfo(free_bytes=1 << 30, total_bytes=2 << 30)
"""


def platform_source(cls: str, name: str, priority: int = 50, available: bool = True) -> str:
    return PLATFORM_TEMPLATE.format(cls=cls, name=name, priority=priority, available=available)


class PluginSandbox:
    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        self.monkeypatch = monkeypatch
        self.extra: list[EntryPoint] = []
        monkeypatch.syspath_prepend(str(root))
        real = manager.entry_points

        def fake_entry_points(group: str):
            found = list(real(group=group))
            if group != ENTRY_POINT_GROUP:
                return found
            return [ep for ep in found if ep.name == manager.BUILTIN_PLUGIN] + self.extra

        monkeypatch.setattr(manager, "entry_points", fake_entry_points)

    def write(self, module: str, source: str, header: bool = True) -> None:
        text = (HEADER if header else "") + textwrap.dedent(source)
        (self.root / f"{module}.py").write_text(text)
        sys.modules.pop(module, None)
        importlib.invalidate_caches()

    def add(self, name: str, source: str, header: bool = True, entry_point: bool = True) -> None:
        self.write(name, source, header)
        if entry_point:
            self.extra.append(EntryPoint(name=name, value=name, group=ENTRY_POINT_GROUP))


ENV_VARIABLES = (
    "OCTAVO_PLATFORM", "OCTAVO_PLUGINS", "OCTAVO_DISABLE_PLUGIN_AUTOLOAD", "OCTAVO_ATTENTION_BACKEND", "OCTAVO_LAYER_OPS",
)


@pytest.fixture
def sandbox(tmp_path, monkeypatch) -> PluginSandbox:
    for variable in ENV_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    manager.reset_plugin_manager()
    box = PluginSandbox(tmp_path / "plugins", monkeypatch)
    box.root.mkdir()
    yield box
    manager.reset_plugin_manager()
    for path in box.root.glob("*.py"):
        sys.modules.pop(path.stem, None)


@pytest.fixture
def fresh_plugins(sandbox) -> None:
    """Only the built-in plugin, loaded afresh."""
