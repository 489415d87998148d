#!/usr/bin/env bash
# Set up the project's virtualenv for `make run` (LEVEL=run) or `make test`
# (LEVEL=test), or do nothing at all when it is already set up.
#
#   VENV        the virtualenv (default .venv), created if missing
#   PYTHON      the Python that creates it (default python3; 3.11 or newer)
#   TORCH       cpu or cuda (default: cuda where `nvidia-smi -L` lists a GPU)
#   TORCH_VERSION           torch for the CPU build (default 2.13.0)
#   TORCH_CPU_INDEX         where CPU wheels come from when pip finds none locally
#
# What is installed is recorded in a stamp file in the virtualenv, named after
# a hash of everything that decides it (pyproject.toml files, this script, the
# torch build): when the stamp is there, nothing runs, not even pip. `test`
# installs a superset of `run`, so it writes both stamps. Every pip command is
# appended to $VENV/octavo-setup.log, so that a check can see none ran.
set -euo pipefail
SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$SELF")/.."

LEVEL=${1:?usage: ensure_env.sh run|test}
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
TORCH_CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
PLUGIN=plugins/octavo-example-accelerator

say() { echo "octavo-setup: $*" >&2; }
fail() { say "FAILED: $*"; exit 1; }

if [[ -z ${TORCH:-} ]]; then
  TORCH=cpu
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then TORCH=cuda; fi
fi
[[ $TORCH == cpu || $TORCH == cuda ]] || fail "TORCH must be cpu or cuda, not '$TORCH'"

key=$( { cat pyproject.toml "$PLUGIN/pyproject.toml" "$SELF"; echo "$TORCH $TORCH_VERSION"; } | sha256sum | cut -c1-16)
stamp() { echo "$VENV/.octavo-$1-$key.stamp"; }
[[ -e $(stamp "$LEVEL") ]] && exit 0

if [[ ! -x $VENV/bin/python ]]; then
  command -v "$PYTHON" >/dev/null 2>&1 || fail "no $PYTHON on PATH (set PYTHON=/path/to/python3.11+)"
  "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || fail "$PYTHON is older than Python 3.11"
  say "creating the virtualenv $VENV"
  "$PYTHON" -m venv "$VENV" || fail "creating $VENV (on Debian/Ubuntu: apt-get install python3-venv)"
fi

pip() {
  echo "pip $*" >> "$VENV/octavo-setup.log"
  "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"
}

installed_torch() {
  "$VENV/bin/python" -c 'from importlib.metadata import version; print(version("torch"))' 2>/dev/null || true
}

install_torch() {
  local have
  have=$(installed_torch)
  if [[ $TORCH == cpu ]]; then
    # macOS wheels are CPU builds; on Linux, PyTorch's +cpu build: a wheel pip
    # finds on this machine (--find-links) or the one on PyTorch's CPU index.
    # Only the wheel comes from there (--no-deps); its dependencies, from the
    # usual index, in the last step.
    local want="torch==$TORCH_VERSION+cpu"
    [[ $(uname -s) == Darwin ]] && want="torch==$TORCH_VERSION"
    [[ $have == "${want#torch==}" ]] && return 0
    say "installing $want (PyTorch's CPU build; no NVIDIA GPU found)"
    if [[ $want == *+cpu ]]; then
      pip install --no-deps --no-index "$want" 2>/dev/null || pip install --no-deps "$want" --index-url "$TORCH_CPU_INDEX" \
        || fail "installing $want from $TORCH_CPU_INDEX (see pip's message above)"
    fi
    pip install "$want" || fail "installing $want (see pip's message above)"
  else
    [[ -n $have && $have != *+cpu ]] && return 0
    # A CPU build satisfies the version range: it has to go first.
    if [[ -n $have ]]; then pip uninstall -y torch || fail "removing the CPU build of torch"; fi
    say "installing torch (CUDA build; nvidia-smi found a GPU)"
    pip install "torch>=2.11" || fail "installing torch with CUDA (see pip's message above)"
  fi
}

install_torch
extras=$([[ $TORCH == cuda ]] && echo cuda || true)
if [[ $LEVEL == test ]]; then
  say "installing Octavo with its test dependencies, and the example platform plugin"
  pip install -e ".[test${extras:+,$extras}]" -e "$PLUGIN" || fail "installing Octavo's test dependencies (see pip's message above)"
  touch "$(stamp run)"
else
  say "installing Octavo"
  pip install -e ".${extras:+[$extras]}" || fail "installing Octavo (see pip's message above)"
fi
rm -f "$VENV"/.octavo-"$LEVEL"-*.stamp
touch "$(stamp "$LEVEL")"
say "ready ($VENV, torch $(installed_torch))"
