"""pytest plugin (entry point ``pytest11: octavo``): the ``--octavo-platform``
option of the conformance suite. Imports nothing heavy: it loads into every
pytest session of an environment where Octavo is installed."""

from __future__ import annotations


def pytest_addoption(parser):
    parser.addoption(
        "--octavo-platform",
        default=None,
        help="Octavo conformance suite: the platform to check (default: OCTAVO_PLATFORM, else the selected one)",
    )
