"""Choosing a platform's attention backend by name.

Backends are registered by plugins (``octavo_attention_backends``); a
platform only names them, most preferred first (``Platform.attention_backends``).
The rule:

1. ``OCTAVO_ATTENTION_BACKEND=name`` wins; if that backend is not installed
   or refuses the model, startup fails (it was asked for explicitly). Values
   may be scoped to a platform (``cuda:triton_paged,cpu:torch_paged``; see
   ``scoped_env``): a value scoped to another platform does not apply.
2. Otherwise the first backend of the platform's list that is installed and
   whose ``supports(spec)`` returns None; every one skipped is logged with
   its reason.
3. Otherwise ``torch_paged``, the reference, with the reasons logged; if even
   that refuses the model, ``PlatformError`` lists every reason.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from octavo.errors import PlatformError
from octavo.platforms.scoped_env import scoped_value

if TYPE_CHECKING:
    from octavo.core.attention import AttentionBackend, AttentionSpec
    from octavo.platforms.interface import Platform

logger = logging.getLogger(__name__)

REFERENCE_BACKEND = "torch_paged"
OVERRIDE_ENV = "OCTAVO_ATTENTION_BACKEND"


def installed_attention_backends() -> dict[str, type[AttentionBackend]]:
    """``{name: backend class}`` from every loaded plugin (later plugins win)."""
    from octavo.plugins.manager import get_plugin_manager

    backends: dict[str, type[AttentionBackend]] = {}
    for result in get_plugin_manager().hook.octavo_attention_backends():
        backends.update(result or {})
    return backends


@dataclass
class BackendChoice:
    """Which backend class was chosen and why (``octavo env`` shows this)."""

    backend_class: type[AttentionBackend]
    reason: str
    skipped: list[str] = field(default_factory=list)  # "name (why not)"


def choose_attention_backend(platform: Platform, spec: AttentionSpec) -> BackendChoice:
    """The backend class for ``spec`` on ``platform``, by the rule above."""
    from octavo.core.attention import backend_refusal

    backends = installed_attention_backends()
    override = attention_override(platform.name)
    if override:
        backend_class = backends.get(override)
        if backend_class is None:
            raise PlatformError(
                f"{OVERRIDE_ENV}={override!r}: no such attention backend (installed: {', '.join(sorted(backends))})"
            )
        refusal = backend_refusal(backend_class, spec)
        if refusal is not None:
            raise PlatformError(f"{OVERRIDE_ENV}={override!r} cannot run this model: {refusal}")
        return BackendChoice(backend_class, f"requested by {OVERRIDE_ENV}")
    skipped: list[str] = []
    for name in _with_reference(platform.attention_backends):
        backend_class = backends.get(name)
        refusal = "not installed" if backend_class is None else backend_refusal(backend_class, spec)
        if refusal is None:
            reason = f"preferred by {platform.name}" if not skipped else f"fallback on {platform.name}"
            return BackendChoice(backend_class, reason, skipped)
        skipped.append(f"{name} ({refusal})")
    raise PlatformError(f"no attention backend on {platform.name} can run this model ({'; '.join(skipped)})")


def attention_override(platform_name: str) -> str | None:
    """The backend ``OCTAVO_ATTENTION_BACKEND`` forces on ``platform_name``, if any."""
    return scoped_value(OVERRIDE_ENV, os.environ.get(OVERRIDE_ENV), platform_name)


def _with_reference(names: tuple[str, ...]) -> list[str]:
    return list(names) + ([REFERENCE_BACKEND] if REFERENCE_BACKEND not in names else [])


def resolve_attention_backend(platform: Platform, spec: AttentionSpec) -> AttentionBackend:
    """An instance of the chosen backend; skipped preferences are logged."""
    choice = choose_attention_backend(platform, spec)
    for skipped in choice.skipped:
        logger.warning("%s: not using attention backend %s", platform.name, skipped)
    logger.info("%s: attention backend %s (%s)", platform.name, choice.backend_class.name, choice.reason)
    return choice.backend_class(spec)
