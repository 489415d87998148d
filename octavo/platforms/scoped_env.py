"""Override variables whose entries can be scoped to one platform.

``OCTAVO_ATTENTION_BACKEND`` and ``OCTAVO_LAYER_OPS`` hold comma-separated
entries; an entry written ``platform:entry`` applies only when that
platform is selected, an entry without a prefix applies everywhere, and on
the platform it names a scoped entry wins over an unscoped one. So one
environment can carry settings for a mixed fleet, e.g.
``OCTAVO_LAYER_OPS=cuda:linear=reference,example:rms_norm=reference``.
"""

from __future__ import annotations

from octavo.errors import InvalidArgumentError


def split_scope(entry: str) -> tuple[str | None, str]:
    """``"cuda:x=y"`` -> ``("cuda", "x=y")``; ``"x=y"`` -> ``(None, "x=y")``."""
    scope, sep, rest = entry.partition(":")
    if not sep:
        return None, entry
    if not scope or not rest:
        raise InvalidArgumentError(f"malformed override entry {entry!r} (expected [platform:]value)")
    return scope.strip(), rest.strip()


def scoped_entries(value: str | None, platform_name: str) -> list[str]:
    """The entries of ``value`` that apply on ``platform_name``: unscoped ones
    first, then those scoped to it (so that, read in order, scoped ones win)."""
    unscoped, scoped = [], []
    for raw in (value or "").split(","):
        entry = raw.strip()
        if not entry:
            continue
        scope, rest = split_scope(entry)
        if scope is None:
            unscoped.append(rest)
        elif scope == platform_name:
            scoped.append(rest)
    return unscoped + scoped


def scoped_value(variable: str, value: str | None, platform_name: str) -> str | None:
    """The one value of a single-valued override on ``platform_name`` (None: not set for it)."""
    entries = scoped_entries(value, platform_name)
    if not entries:
        return None
    unscoped = [e.strip() for e in (value or "").split(",") if e.strip() and ":" not in e]
    if len(unscoped) > 1:
        raise InvalidArgumentError(f"{variable}={value!r}: several values without a platform prefix")
    return entries[-1]
