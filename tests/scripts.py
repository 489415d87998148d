"""Importing a script (``benchmarks/*.py``) as a module, for its CPU smoke tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_script(path: Path, module_name: str, monkeypatch) -> ModuleType:
    """The script at ``path`` as module ``module_name``, registered in ``sys.modules``
    for the test's duration (dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module
