"""Turning an op's resolved chain of implementations into one callable.

A chain is the implementations that serve, best first, cut after the first
one without per-call conditions (nothing after it could run). The callable
is, cheapest first:

* that implementation's own function, when it has no per-call condition;
* a closure comparing ``args[0].shape[0]`` with one ``max_tokens`` and
  calling the implementation or the fallback (the GEMV at 1 token);
* otherwise a loop over the chain's conditions, then the fallback.

The fallback is the op's reference, or for a fused op (``OpSpec.compose``)
the composition of the ops already resolved. Branches read shapes only,
never tensor values, so a captured CUDA graph replays the branch it took.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from octavo.ops.specs import OP_SPECS
from octavo.ops.table import ChainStep, LayerOps, OpChoice, WeightLayout


@dataclass(frozen=True)
class ResolvedStep:
    fn: Callable
    step: ChainStep
    max_tokens: int | None = None
    accepts: Callable[..., bool] | None = None

    @property
    def unconditional(self) -> bool:
        return self.max_tokens is None and self.accepts is None


def _dispatch(steps: list[ResolvedStep], fallback: Callable) -> Callable:
    if not steps:
        return fallback
    first = steps[0]
    if first.unconditional:
        return first.fn
    if len(steps) == 1 and first.accepts is None:
        fast, limit = first.fn, first.max_tokens

        def within_max_tokens(*args):
            if args[0].shape[0] <= limit:
                return fast(*args)
            return fallback(*args)

        return within_max_tokens
    conditions = [(s.fn, s.max_tokens, s.accepts) for s in steps]

    def first_that_accepts(*args):
        for fn, limit, accepts in conditions:
            if (limit is None or args[0].shape[0] <= limit) and (accepts is None or accepts(*args)):
                return fn(*args)
        return fallback(*args)

    return first_that_accepts


def assemble_layer_ops(
    chains: dict[str, list[ResolvedStep]],
    skipped: dict[str, list[str]] | None = None,
    forced: set[str] | None = None,
    layouts: dict[str, WeightLayout] | None = None,
) -> LayerOps:
    """The table for ``chains`` (op -> serving implementations, best first); ops
    without one run their reference (or their composition). ``layouts``: per
    op, the implementation with its own weight layout that serves, if any."""
    layouts = layouts or {}
    resolved: dict[str, Callable] = {}
    choices: dict[str, OpChoice] = {}
    for name, spec in OP_SPECS.items():
        steps = chains.get(name, [])
        cut = next((i for i, s in enumerate(steps) if s.unconditional), None)
        if cut is not None:
            steps = steps[: cut + 1]
        if spec.compose is not None:
            fallback, fallback_label = spec.compose(resolved), "composed (" + ", ".join(spec.composed_of) + ")"
        else:
            fallback, fallback_label = spec.reference, "reference"
        resolved[name] = _dispatch(steps, fallback)
        always_served = bool(steps) and steps[-1].unconditional
        choices[name] = OpChoice(
            name,
            tuple(s.step for s in steps),
            None if always_served else fallback_label,
            tuple((skipped or {}).get(name, ())),
            name in (forced or set()),
            layouts[name].label if name in layouts else None,
        )
    return LayerOps(**resolved, choices=choices, layouts=dict(layouts))


@functools.cache
def reference_layer_ops() -> LayerOps:
    """Every op's plain-torch reference (fused ops composed of references)."""
    return assemble_layer_ops({})
