"""The ``ops`` check: every layer-op implementation that serves this platform
against its op's reference, over the grid of ``op_cases``, per dtype.

For each dtype the platform supports, the implementations are found as the
model builder finds them (``find_candidates``: every plugin's, not only the
winner, so that one a user forces with ``OCTAVO_LAYER_OPS`` is checked
too). Each runs on the device on the cases its per-call conditions accept;
the reference runs on the CPU on equal inputs; outputs, the arguments the
op writes (a KV cache) and the arguments it must leave alone are compared
within the op's tolerance. A failure names the op, the implementation, its
plugin, the dtype and the case. The summary says which ops run their
reference on this platform (no implementation serves them) and which only
for some calls.
"""

from __future__ import annotations

import torch

from octavo.ops import OP_SPECS, OpContext, Tolerance
from octavo.ops.resolution import Loaded, find_candidates, resolve_layer_ops
from octavo.testing.conformance.checks import ConformanceContext, ConformanceFailure
from octavo.testing.conformance.op_cases import OP_CASES, OpCase


def _to_cpu(value):
    return value.detach().to("cpu", copy=True) if isinstance(value, torch.Tensor) else value


def _clone(value):
    return value.clone() if isinstance(value, torch.Tensor) else value


def _flat(result) -> list[torch.Tensor]:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _error(got: torch.Tensor, expected: torch.Tensor, tolerance: Tolerance) -> str | None:
    """Why ``got`` is not ``expected`` within ``tolerance``, or None."""
    if tuple(got.shape) != tuple(expected.shape):
        return f"shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    if got.dtype != expected.dtype:
        return f"dtype {got.dtype}, expected {expected.dtype}"
    if not expected.dtype.is_floating_point:  # ids (a router's experts): exact
        mismatches = int((got.detach().cpu() != expected).sum())
        return None if mismatches == 0 else f"{mismatches} of {expected.numel()} values differ"
    ours, ref = got.detach().cpu().float(), expected.float()
    if not bool(torch.isfinite(ours).all()):
        return "output is not finite"
    if tolerance.relative_norm is not None:
        relative = float((ours - ref).norm() / ref.norm().clamp(min=1e-30))
        return None if relative <= tolerance.relative_norm else f"relative error {relative:.2e} > {tolerance.relative_norm}"
    excess = (ours - ref).abs() - (tolerance.atol + tolerance.rtol * ref.abs())
    if bool((excess <= 0).all()):
        return None
    return f"max abs error {float((ours - ref).abs().max()):.2e} ({tolerance.describe()})"


def _run_case(op: str, item: Loaded, case: OpCase, dtype: torch.dtype, device: torch.device) -> str | None:
    """None when the case ran and matched, "skip" when the implementation declines it, else the failure."""
    spec, impl = OP_SPECS[op], item.registered.impl
    if impl.max_tokens is not None and case.num_tokens > impl.max_tokens:
        return "skip"
    args = case.make(dtype, device, torch.Generator().manual_seed(len(case.label)))
    if impl.accepts is not None and not impl.accepts(*args):
        return "skip"
    ref_args = [_to_cpu(a) for a in args]
    untouched = {name: _clone(a) for name, a in zip(spec.params, args) if name not in spec.may_modify + spec.writes}
    expected = _flat(spec.reference(*ref_args))
    impl_args = args
    if item.repack is not None:  # an implementation with its own weight layout: the case's weights in it
        impl_args = _repacked(spec, item.repack, args)
        if impl_args is None:
            return "skip"
    got = _flat(item.fn(*impl_args))
    if len(got) != len(expected):
        return f"returned {len(got)} tensors, expected {len(expected)}"
    tolerance = spec.tolerance[dtype]
    for index, (ours, ref) in enumerate(zip(got, expected)):
        if (problem := _error(ours, ref, tolerance)) is not None:
            return f"output {index}: {problem}"
    for name in spec.writes:
        index = spec.params.index(name)
        if (problem := _error(args[index], ref_args[index], tolerance)) is not None:
            return f"{name} as written: {problem}"
    for name, before in untouched.items():
        after = args[spec.params.index(name)]
        if isinstance(before, torch.Tensor) and not torch.equal(before, after):
            return f"it modified its argument {name}, which the op's contract leaves alone"
    return None


def _repacked(spec, repack, args: tuple) -> tuple | None:
    """``args`` with the op's weights in ``repack``'s layout (None: it does not take them)."""
    named = dict(zip(spec.params, args))
    packed = repack(**{name: named[name] for name in spec.repack_params})
    if packed is None:
        return None
    return tuple(packed.get(name, value) for name, value in named.items())


def _check_implementation(op: str, item: Loaded, dtype: torch.dtype, device: torch.device) -> int:
    impl, plugin = item.registered.impl, item.registered.plugin
    ran = 0
    for case in OP_CASES[op]:
        label = f"{op}={impl.name} [{plugin}] {str(dtype).removeprefix('torch.')}, {case.label}"
        try:
            outcome = _run_case(op, item, case, dtype, device)
        except Exception as exc:
            raise ConformanceFailure(f"{label}: raised {type(exc).__name__}: {exc}") from exc
        if outcome == "skip":
            continue
        if outcome is not None:
            raise ConformanceFailure(f"{label}: {outcome}")
        ran += 1
    if ran == 0:
        raise ConformanceFailure(f"{op}={impl.name} [{plugin}]: no case of the grid is within its per-call conditions")
    return ran


def _fallback_summary(ctx: ConformanceContext) -> str:
    tables = [resolve_layer_ops(ctx.platform, ctx.device, dtype) for dtype in ctx.dtypes]
    # No implementation at all: the reference (a fused op: its composition).
    reference = [op for op in OP_SPECS if not any(t.choice(op).chain or t.choice(op).layout for t in tables)]
    partly = [
        next(t for t in tables if t.choice(op).chain or t.choice(op).layout).choice(op).describe() for op in OP_SPECS
        if op not in reference and any(t.choice(op).fallback is not None for t in tables)
    ]
    named = [f"{op} (composed)" if OP_SPECS[op].compose else op for op in reference]
    text = f"reference on {ctx.platform.name}: " + (", ".join(named) or "none")
    return text + (f"; partly: {'; '.join(partly)}" if partly else "")


def check_ops(ctx: ConformanceContext) -> str:
    implementations, cases = set(), 0
    for dtype in ctx.dtypes:
        candidates = find_candidates(OpContext(ctx.platform, ctx.device, dtype))
        for op, items in candidates.serving.items():
            for item in items:
                cases += _check_implementation(op, item, dtype, ctx.device)
                implementations.add(f"{op}={item.registered.impl.name} [{item.registered.plugin}]")
    ctx.platform.synchronize()
    checked = f"{len(implementations)} implementations match their references ({cases} cases)"
    if implementations:
        checked += ": " + ", ".join(sorted(implementations))
    return f"{checked}; {_fallback_summary(ctx)}"
