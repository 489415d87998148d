"""Resolving every layer op once, for one model on one platform.

1. Every plugin's ``octavo_layer_ops`` hook lists ``OpImpl``s (malformed
   ones made the plugin broken when it loaded).
2. The implementations meant for this platform (``platforms`` /
   ``device_types``) are imported and their signatures checked. A plugin
   one of whose implementations fails here is recorded as broken and *all*
   its implementations are dropped: never half-installed.
3. Per op, in ``OP_SPECS`` order: the implementations whose ``dtypes`` and
   ``supports(ctx)`` accept this model serve, highest priority first (a
   tie goes to the plugin loaded later). A ``supports`` that raises marks
   its plugin broken as in 2 (an ``OctavoError`` it raises is the user's
   and stops startup).
4. ``OCTAVO_LAYER_OPS=op=impl,...`` (entries may be scoped,
   ``cuda:op=impl``) forces an implementation, or ``reference``; a forced
   name that does not exist or does not serve here stops startup, listing
   the ones that do.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from octavo.errors import InvalidArgumentError, OctavoError, PlatformError
from octavo.ops.dispatch import ResolvedStep, assemble_layer_ops
from octavo.ops.impl import REFERENCE, OpContext, OpImpl
from octavo.ops.specs import OP_SPECS
from octavo.ops.table import ChainStep, LayerOps, WeightLayout
from octavo.platforms.scoped_env import scoped_entries

logger = logging.getLogger(__name__)

LAYER_OPS_ENV = "OCTAVO_LAYER_OPS"


@dataclass(frozen=True)
class Registered:
    impl: OpImpl
    plugin: str
    order: int  # the plugin's load order: later wins ties


@dataclass(frozen=True)
class Loaded:
    registered: Registered
    fn: Callable
    repack: Callable | None = None


class _PluginFailed(Exception):
    def __init__(self, plugin: str, problem: str) -> None:
        super().__init__(problem)
        self.plugin, self.problem = plugin, problem


def registered_layer_ops() -> list[Registered]:
    """Every plugin's implementations, in plugin load order."""
    from octavo.plugins.manager import get_plugin_manager

    results = get_plugin_manager().hook.octavo_layer_ops.with_plugin_names()
    return [Registered(impl, plugin, order) for order, (plugin, impls) in enumerate(results) for impl in impls or []]


def parse_layer_op_overrides(value: str | None, platform_name: str) -> dict[str, str]:
    """``{op: implementation name}`` forced on ``platform_name`` by ``OCTAVO_LAYER_OPS``."""
    overrides: dict[str, str] = {}
    for entry in scoped_entries(value, platform_name):
        op, sep, impl = (part.strip() for part in entry.partition("="))
        if not sep or not op or not impl:
            raise InvalidArgumentError(f"{LAYER_OPS_ENV}: malformed entry {entry!r} (expected [platform:]op=implementation)")
        if op not in OP_SPECS:
            raise InvalidArgumentError(f"{LAYER_OPS_ENV}: unknown layer op {op!r} (ops: {', '.join(OP_SPECS)})")
        overrides[op] = impl
    return overrides


def _names_for(op: str, registered: list[Registered]) -> str:
    names = [f"{r.impl.name} [{r.plugin}]" for r in registered if r.impl.op == op]
    return ", ".join([REFERENCE] + names)


def check_layer_op_overrides(platform_name: str) -> None:
    """In the engine process, before workers start: ``OCTAVO_LAYER_OPS`` is well
    formed and names implementations that exist (whether they serve this model
    is decided when the worker resolves)."""
    overrides = parse_layer_op_overrides(os.environ.get(LAYER_OPS_ENV), platform_name)
    registered = registered_layer_ops()
    for op, name in overrides.items():
        if name != REFERENCE and not any(r.impl.op == op and r.impl.name == name for r in registered):
            raise PlatformError(
                f"{LAYER_OPS_ENV}: no implementation {name!r} of {op} is installed "
                f"(installed: {_names_for(op, registered)})"
            )


@dataclass
class Candidates:
    """The implementations of every op that serve a model here, best first,
    and those that refused it (``octavo env``, the conformance kit)."""

    registered: list[Registered]
    serving: dict[str, list[Loaded]]
    refused: dict[str, list[tuple[Loaded, str]]]


def _load_for_platform(registered: list[Registered], ctx: OpContext) -> list[Loaded]:
    loaded = []
    for entry in registered:
        if entry.impl.platform_mismatch(ctx.platform) is not None:
            continue
        try:
            loaded.append(Loaded(entry, entry.impl.load(), entry.impl.load_repack()))
        except Exception as exc:
            raise _PluginFailed(entry.plugin, f"layer op {entry.impl.label}: {type(exc).__name__}: {exc}") from exc
    return loaded


def _refusal(entry: Registered, ctx: OpContext) -> str | None:
    try:
        return entry.impl.refusal(ctx)
    except OctavoError:
        raise
    except Exception as exc:
        raise _PluginFailed(entry.plugin, f"layer op {entry.impl.label}: supports raised {type(exc).__name__}: {exc}") from exc


def _candidates(registered: list[Registered], ctx: OpContext) -> Candidates:
    serving: dict[str, list[Loaded]] = {op: [] for op in OP_SPECS}
    refused: dict[str, list[tuple[Loaded, str]]] = {op: [] for op in OP_SPECS}
    for item in _load_for_platform(registered, ctx):
        reason = _refusal(item.registered, ctx)
        if reason is None:
            serving[item.registered.impl.op].append(item)
        else:
            refused[item.registered.impl.op].append((item, reason))
    for items in serving.values():
        items.sort(key=lambda item: (-item.registered.impl.priority, -item.registered.order))
    return Candidates(registered, serving, refused)


def find_candidates(ctx: OpContext) -> Candidates:
    """Every op's implementations for ``ctx``; plugins failing here are recorded
    as broken and dropped whole (never half-installed)."""
    from octavo.plugins.manager import record_broken

    registered = registered_layer_ops()
    while True:
        try:
            return _candidates(registered, ctx)
        except _PluginFailed as failure:
            record_broken(failure.plugin, failure.problem)
            registered = [r for r in registered if r.plugin != failure.plugin]


def _step(item: Loaded) -> ResolvedStep:
    impl = item.registered.impl
    conditions = []
    if impl.max_tokens is not None:
        conditions.append(f"up to {impl.max_tokens} token{'s' if impl.max_tokens > 1 else ''}")
    if impl.accepts is not None:
        conditions.append("where it accepts the call")
    step = ChainStep(impl.name, item.registered.plugin, " and ".join(conditions))
    return ResolvedStep(item.fn, step, impl.max_tokens, impl.accepts)


def _forced(op: str, name: str, candidates: Candidates, ctx: OpContext) -> list[Loaded]:
    if name == REFERENCE:
        return []
    serving = [item for item in candidates.serving[op] if item.registered.impl.name == name]
    if serving:
        return serving
    refusals = [f"{item.registered.plugin}: {why}" for item, why in candidates.refused[op] if item.registered.impl.name == name]
    for entry in candidates.registered:
        mismatch = entry.impl.platform_mismatch(ctx.platform)
        if entry.impl.op == op and entry.impl.name == name and mismatch:
            refusals.append(f"{entry.plugin}: {mismatch}")
    why = f" ({'; '.join(refusals)})" if refusals else ""
    raise PlatformError(
        f"{LAYER_OPS_ENV}: {op}={name} does not serve this model on {ctx.platform.name}{why} "
        f"(installed: {_names_for(op, candidates.registered)})"
    )


def resolve_layer_ops(platform, device: torch.device, dtype: torch.dtype) -> LayerOps:
    """The layer-op table for a model of ``dtype`` on ``device`` of ``platform``."""
    ctx = OpContext(platform, device, dtype)
    overrides = parse_layer_op_overrides(os.environ.get(LAYER_OPS_ENV), platform.name)
    candidates = find_candidates(ctx)
    chains: dict[str, list[ResolvedStep]] = {}
    skipped: dict[str, list[str]] = {}
    layouts: dict[str, WeightLayout] = {}
    for op in OP_SPECS:
        if op in overrides:
            serving = _forced(op, overrides[op], candidates, ctx)
        else:
            serving = candidates.serving[op]
            skipped[op] = [f"{i.registered.impl.name} [{i.registered.plugin}] ({why})" for i, why in candidates.refused[op]]
        # An implementation with its own weight layout is not in the chain:
        # the layers it takes call it alone (the best such one serves).
        own_layout = [item for item in serving if item.repack is not None]
        if own_layout:
            best = own_layout[0]
            label = f"{best.registered.impl.name} [{best.registered.plugin}]"
            layouts[op] = WeightLayout(best.fn, best.repack, label)
        chains[op] = [_step(item) for item in serving if item.repack is None]
    return assemble_layer_ops(chains, skipped, set(overrides), layouts)


def log_layer_ops(ops: LayerOps, platform_name: str, dtype: torch.dtype) -> None:
    accelerated = [ops.choice(op).describe() for op in OP_SPECS if not ops.choice(op).is_reference]
    references = [op for op in OP_SPECS if ops.choice(op).is_reference]
    logger.info(
        "layer ops on %s (%s): %s; reference: %s",
        platform_name,
        str(dtype).removeprefix("torch."),
        "; ".join(accelerated) or "none accelerated",
        ", ".join(references) or "none",
    )
