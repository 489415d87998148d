"""`make run` and `make test` from a fresh directory, with a stand-in Python
whose pip only logs what it is asked (so the setup logic runs in a second):
the first run creates the virtualenv and installs the right torch build and
Octavo with the command's extras; a second run calls no pip at all; a change
to pyproject.toml installs again; a failing pip is reported. (.ci/run runs the
real thing on a fresh clone.)"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = "plugins/octavo-example-accelerator"

FAKE_PYTHON = r"""#!/usr/bin/env bash
# -m venv DIR: DIR/bin/{python,octavo,pytest}; -m pip ...: logged (FAKE_PIP_FAIL=1: fails;
# --no-index finds nothing); -c CODE: the torch version a logged install recorded.
here=$(cd "$(dirname "$0")" && pwd)
if [[ $1 == -m && $2 == venv ]]; then
  mkdir -p "$3/bin"; cp "$0" "$3/bin/python"
  for tool in octavo pytest; do printf '#!/usr/bin/env bash\necho "%s${*:+ $*}" >> "$FAKE_LOG"\n' "$tool" > "$3/bin/$tool"; chmod +x "$3/bin/$tool"; done
elif [[ $1 == -m && $2 == pip ]]; then
  shift 2; line="$*"; echo "pip ${line#--disable-pip-version-check -q }" >> "$FAKE_LOG"
  [[ ${FAKE_PIP_FAIL:-} == 1 || $* == *--no-index* ]] && exit 1
  if [[ $* =~ torch==([^ ]+) ]]; then echo "${BASH_REMATCH[1]}" > "$here/../torch-version"; fi
  if [[ $* == *"torch>=2.11"* ]]; then echo "2.11.0" > "$here/../torch-version"; fi
elif [[ $1 == -c && $2 != *sys.version_info* ]]; then
  cat "$here/../torch-version" 2>/dev/null
fi
exit 0
"""


@pytest.fixture
def fresh_clone(tmp_path):
    repo = tmp_path / "octavo"
    for name in ("Makefile", "scripts/ensure_env.sh", "pyproject.toml", f"{PLUGIN}/pyproject.toml"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, repo / name)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "fake-python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return repo


def make(repo: Path, target: str, gpu: bool = False, **env) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run ``make target``; returns the result and the lines logged (pip, octavo, pytest calls) by this run."""
    bin_dir = repo.parent / "bin"
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0)'\n" if gpu else "#!/bin/sh\nexit 9\n")
    smi.chmod(0o755)
    log = repo.parent / "calls.log"
    before = log.read_text().splitlines() if log.exists() else []
    # Not the settings of a make that runs this test (make test exports PYTEST_ARGS, ...).
    ours = {"VENV", "TORCH", "TORCH_VERSION", "TORCH_CPU_INDEX", "PROMPT", "PYTEST_ARGS", "MAKEFLAGS", "MFLAGS", "MAKELEVEL"}
    environ = {k: v for k, v in os.environ.items() if k not in ours}
    environ.update(PATH=f"{bin_dir}:{environ['PATH']}", PYTHON=str(bin_dir / "fake-python"), FAKE_LOG=str(log), **env)
    result = subprocess.run(["make", "-s", target], cwd=repo, env=environ, capture_output=True, text=True, timeout=60)
    after = log.read_text().splitlines() if log.exists() else []
    return result, after[len(before):]


def test_run_then_again_then_test(fresh_clone):
    first, calls = make(fresh_clone, "run")
    assert first.returncode == 0, first.stderr
    assert calls == [
        "pip install --no-deps --no-index torch==2.13.0+cpu",
        "pip install --no-deps torch==2.13.0+cpu --index-url https://download.pytorch.org/whl/cpu",
        "pip install torch==2.13.0+cpu",
        "pip install -e .",
        "octavo generate Once upon a time",
    ]
    for step in ("creating the virtualenv .venv", "installing torch==2.13.0+cpu", "installing Octavo", "ready"):
        assert f"octavo-setup: {step}" in first.stderr
    # Everything in place: no pip at all, and nothing said.
    second, calls = make(fresh_clone, "run")
    assert second.returncode == 0 and second.stderr == ""
    assert calls == ["octavo generate Once upon a time"]
    # The tests need more: the test extras and the example plugin, not torch again.
    test, calls = make(fresh_clone, "test")
    assert test.returncode == 0, test.stderr
    assert calls[0] == f"pip install -e .[test] -e {PLUGIN}"
    assert calls[1:] == [
        "octavo plugins list", "octavo plugins check cpu", "octavo plugins check example",
        "pytest --pyargs octavo.testing.conformance --octavo-platform example -p no:cacheprovider", "pytest",
    ]
    for target in ("test", "run"):
        again, calls = make(fresh_clone, target)
        assert again.returncode == 0 and not [c for c in calls if c.startswith("pip")]


def test_a_changed_pyproject_installs_again(fresh_clone):
    make(fresh_clone, "run")
    with (fresh_clone / "pyproject.toml").open("a") as f:
        f.write("\n# a new dependency\n")
    result, calls = make(fresh_clone, "run")
    assert result.returncode == 0
    assert calls == ["pip install -e .", "octavo generate Once upon a time"]  # torch is there already


def test_a_gpu_gets_the_cuda_build(fresh_clone):
    result, calls = make(fresh_clone, "run", gpu=True)
    assert result.returncode == 0, result.stderr
    assert calls[:2] == ["pip install torch>=2.11", "pip install -e .[cuda]"]
    assert "installing torch (CUDA build; nvidia-smi found a GPU)" in result.stderr


def test_a_gpu_replaces_the_cpu_build(fresh_clone):
    make(fresh_clone, "run")
    result, calls = make(fresh_clone, "run", gpu=True)
    assert result.returncode == 0, result.stderr
    assert calls[:3] == ["pip uninstall -y torch", "pip install torch>=2.11", "pip install -e .[cuda]"]


def test_a_failed_install_says_what_failed(fresh_clone):
    result, calls = make(fresh_clone, "run", FAKE_PIP_FAIL="1")
    assert result.returncode != 0
    assert "octavo-setup: FAILED: installing torch==2.13.0+cpu from https://download.pytorch.org/whl/cpu (see pip's message above)" in result.stderr
    assert not any(c.startswith("octavo") for c in calls)
    assert not list((fresh_clone / ".venv").glob(".octavo-*.stamp"))
