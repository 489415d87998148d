"""On/off settings read from the environment (A/B runs), for every layer.

Kept apart from ``kernels/triton_utils.py`` (which imports Triton) so that
``core/`` and the runtime read their switches the same way without
importing a kernel module.
"""

from __future__ import annotations

import os

from octavo.errors import InvalidArgumentError


def switch_from_env(name: str, default: bool = True) -> bool:
    """``name=1`` or ``0`` (unset or empty: ``default``); anything else raises
    ``InvalidArgumentError`` (the platforms and the engine read these at startup)."""
    value = os.environ.get(name) or ("1" if default else "0")
    if value not in ("0", "1"):
        raise InvalidArgumentError(f"{name}={value!r}: expected 0 or 1 (the default: {int(default)})")
    return value == "1"
