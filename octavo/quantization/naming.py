"""Layer names as checkpoints spell them, and "not quantized" lists.

Octavo fuses q/k/v and gate/up projections (``qkv_proj``, ``gate_up_proj``)
while checkpoints and their ``ignore`` lists name the separate projections;
``checkpoint_names`` maps a fused layer back to those names. A fused layer is
quantized only if all or none of its shards are listed as ignored; a split
decision cannot be served by one fused weight and is refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from octavo.errors import QuantizationError

FUSED_SHARDS = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}


def checkpoint_names(prefix: str) -> list[str]:
    """``model.layers.0.self_attn.qkv_proj`` -> the q, k, v projection names."""
    parent, _, last = prefix.rpartition(".")
    shards = FUSED_SHARDS.get(last)
    if shards is None:
        return [prefix]
    return [f"{parent}.{shard}" if parent else shard for shard in shards]


def name_matches(name: str, pattern: str) -> bool:
    """``re:REGEX`` matches from the start (compressed-tensors' rule); a plain
    pattern matches the whole name, a dotted suffix of it, or a dotted part."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    return name == pattern or name.endswith("." + pattern) or f".{pattern}." in f".{name}."


def is_ignored(prefix: str, patterns: Iterable[str]) -> bool:
    patterns = list(patterns or ())
    if not patterns:
        return False
    names = checkpoint_names(prefix)
    ignored = [any(name_matches(n, p) for p in patterns) for n in names]
    if all(ignored):
        return True
    if any(ignored):
        listed = [n for n, flag in zip(names, ignored) if flag]
        raise QuantizationError(
            f"{prefix}: the checkpoint leaves {', '.join(listed)} unquantized but not the other projections "
            "fused with it; Octavo cannot mix them in one fused layer"
        )
    return False
