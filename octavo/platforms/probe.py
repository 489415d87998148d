"""Cheap probes for platform detection: is a package installed, do device
files exist. Nothing here imports a vendor package.

``module_installed`` looks at ``sys.modules`` first (a module already
imported, or a stand-in a test put there) and otherwise asks the import
system for a spec of the top-level name only, which imports nothing.
``DEVICE_ROOT`` is the directory device-file patterns are read under
(``/dev``); tests point it at a temporary directory.
"""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os
import sys

DEVICE_ROOT = "/dev"


def module_installed(name: str) -> bool:
    """True when top-level module ``name`` can be imported (without importing it)."""
    if name in sys.modules:
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def device_files(*patterns: str) -> list[str]:
    """Device files matching any of ``patterns`` (relative to ``DEVICE_ROOT``)."""
    found: list[str] = []
    for pattern in patterns:
        found.extend(sorted(glob.glob(os.path.join(DEVICE_ROOT, pattern))))
    return found


def package_version(distribution: str) -> str:
    """A distribution's version from its metadata, or "not installed"."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def env_list(name: str) -> list[str] | None:
    """A comma-separated environment variable as a list; None when unset."""
    value = os.environ.get(name)
    if value is None:
        return None
    return [item for item in value.split(",") if item.strip()]
