"""The conformance checks as pytest tests: one test per check, in order."""

from __future__ import annotations

import pytest

from octavo.testing.conformance.checks import CHECKS, ConformanceSkip


@pytest.mark.parametrize("check_name", list(CHECKS))
def test_conformance(check_name, conformance_context):
    try:
        detail = CHECKS[check_name](conformance_context)
    except ConformanceSkip as exc:
        pytest.skip(str(exc))
    print(f"{conformance_context.platform.name} {check_name}: {detail}")
