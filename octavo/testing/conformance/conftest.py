"""Fixtures for running the conformance suite under pytest.

The platform under test: ``--octavo-platform NAME`` (an option that exists
when Octavo is installed, through its ``pytest11`` entry point), else
``OCTAVO_PLATFORM``, else whichever platform the engine would select.
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def conformance_context(request, tmp_path_factory):
    from octavo.testing.conformance import load_platform
    from octavo.testing.conformance.checks import make_context

    name = request.config.getoption("--octavo-platform", default=None) or os.environ.get("OCTAVO_PLATFORM")
    return make_context(load_platform(name), tmp_path_factory.mktemp("conformance"))
