"""The platform conformance suite: the kit a vendor runs against a platform.

Three ways to run it (see docs/plugins.md):

* ``octavo plugins check NAME`` prints one line per check and exits 1 if
  any failed;
* ``OCTAVO_PLATFORM=NAME pytest --pyargs octavo.testing.conformance`` runs
  the same checks as pytest tests (``test_platform.py`` in this package);
* from Python, ``run_conformance("NAME")`` returns the results.

The checks live in ``checks``; the attention scenarios in ``batches``; the
end-to-end comparison with Hugging Face in ``model``. Every check runs on
the platform's own device (Hugging Face's reference on the platform's
``reference_device()``), with the platform selected exactly as the engine
would select it when asked for by name.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from octavo.platforms.interface import Platform


@dataclass
class CheckResult:
    name: str
    status: str  # "passed", "failed" or "skipped"
    detail: str


def load_platform(name: str | None) -> Platform:
    """The platform ``name`` (None: whichever the engine would select)."""
    from octavo.plugins.selection import select_platform

    return select_platform(name).platform


def run_conformance(
    name: str | None, checks: list[str] | None = None, workdir: Path | None = None
) -> list[CheckResult]:
    """Run the named checks (default: all) against platform ``name``."""
    from octavo.testing.conformance.checks import CHECKS, ConformanceSkip, make_context

    platform = load_platform(name)
    results = []
    with tempfile.TemporaryDirectory(prefix="octavo-conformance-") as tmp:
        ctx = make_context(platform, Path(workdir or tmp))
        for check_name in checks or list(CHECKS):
            try:
                detail = CHECKS[check_name](ctx)
                results.append(CheckResult(check_name, "passed", detail))
            except ConformanceSkip as exc:
                results.append(CheckResult(check_name, "skipped", str(exc)))
            except Exception as exc:  # a crash is a failure of the platform under test
                message = str(exc) if isinstance(exc, AssertionError) else f"{type(exc).__name__}: {exc}"
                results.append(CheckResult(check_name, "failed", message))
    return results


__all__ = ["CheckResult", "load_platform", "run_conformance"]
