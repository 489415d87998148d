"""Running a test file's kernel tests under Triton's interpreter.

Triton decides when it is imported whether kernels are interpreted, so
kernel tests need ``TRITON_INTERPRET=1`` from the start of the process: in a
normal test run, a file's ``test_..._under_interpreter`` re-runs the file in
a subprocess with the variable set, and its in-process copies of the kernel
tests skip (``needs_interpreter``), saying so.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
needs_interpreter = pytest.mark.skipif(
    not INTERPRETED, reason="runs in a TRITON_INTERPRET=1 subprocess (the file's *_under_interpreter test)"
)
not_interpreted = pytest.mark.skipif(INTERPRETED, reason="already under the interpreter")


def rerun_under_interpreter(test_file: str) -> None:
    """Run ``test_file`` with ``TRITON_INTERPRET=1`` and require every test to pass."""
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(Path(test_file).relative_to(root))],
        cwd=root, env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and " failed" not in result.stdout
