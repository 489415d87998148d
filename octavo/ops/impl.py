"""What a plugin registers for a layer op: ``OpImpl``, and the context it is resolved in.

An ``OpImpl`` names the op it implements, its own name (shown by ``octavo
env``, used by ``OCTAVO_LAYER_OPS``), the function (or ``"module:function"``,
imported only on a platform it serves) and the conditions under which it
serves:

* at resolution, once per model: ``platforms`` (platform names),
  ``device_types``, ``dtypes`` (the model's activation dtype), and
  ``supports(ctx) -> reason | None`` for anything else (a device probe);
  an empty tuple means "any";
* per call: ``max_tokens`` (the first argument's leading dimension, the
  number of tokens, at most this; one integer comparison) and
  ``accepts(*args) -> bool`` (a Python call per invocation: use it for
  per-layer shapes, never for values on the device). A call an
  implementation declines goes to the next one, then to the reference.

An implementation with a ``repack`` keeps weights in a layout of its own
(a vendor GEMM's tiles): it is not in the op's chain. Once per layer, after
the layer's weights are loaded, ``repack`` is called with the op's
arguments other than the activations and the bias, by name, and returns
the op's weight arguments (``OpSpec.weights``) in its layout, or None for
a layer it does not take; every call of a layer it took goes to it.

Among the implementations that serve, the highest ``priority`` wins; on a
tie, the plugin loaded later.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from octavo.ops.specs import OP_SPECS

if TYPE_CHECKING:
    from octavo.platforms.interface import Platform

REFERENCE = "reference"


@dataclass(frozen=True)
class OpContext:
    """What ops are resolved for: one model, on one device of one platform."""

    platform: "Platform"
    device: torch.device
    dtype: torch.dtype  # the model's activation dtype


@dataclass(frozen=True)
class OpImpl:
    op: str
    name: str
    fn: Callable | str
    platforms: tuple[str, ...] = ()
    device_types: tuple[str, ...] = ()
    dtypes: tuple[torch.dtype, ...] = ()
    priority: int = 0
    max_tokens: int | None = None
    accepts: Callable[..., bool] | None = None
    supports: Callable[[OpContext], str | None] | None = None
    repack: Callable | str | None = None

    def __post_init__(self) -> None:
        for name in ("platforms", "device_types", "dtypes"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))

    @property
    def label(self) -> str:
        return f"{self.op}={self.name}"

    def problem(self) -> str | None:
        """Why this registration is malformed (checked when the plugin loads), or None."""
        if self.op not in OP_SPECS:
            return f"layer op {self.op!r} does not exist (known: {', '.join(OP_SPECS)})"
        if not isinstance(self.name, str) or not self.name or self.name == REFERENCE:
            return f"{self.op}: implementation name {self.name!r} is empty or reserved"
        if not _is_target(self.fn):
            return f"{self.label}: fn must be a callable or a 'module:function' string, got {self.fn!r}"
        for name, kind in (("platforms", str), ("device_types", str), ("dtypes", torch.dtype)):
            value = getattr(self, name)
            if not isinstance(value, tuple) or not all(isinstance(v, kind) for v in value):
                return f"{self.label}: {name} must be a tuple of {kind.__name__}, got {value!r}"
        if not isinstance(self.priority, int):
            return f"{self.label}: priority must be an int, got {self.priority!r}"
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            return f"{self.label}: max_tokens must be a positive int or None, got {self.max_tokens!r}"
        for name in ("accepts", "supports"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                return f"{self.label}: {name} must be callable"
        if self.repack is not None:
            return self._repack_problem()
        return None

    def _repack_problem(self) -> str | None:
        if not OP_SPECS[self.op].weights:
            return f"{self.label}: layer op {self.op} takes no weights an implementation may repack"
        if not _is_target(self.repack):
            return f"{self.label}: repack must be a callable or a 'module:function' string, got {self.repack!r}"
        if self.max_tokens is not None or self.accepts is not None:
            return f"{self.label}: an implementation with its own weight layout takes every call (no max_tokens, accepts)"
        return None

    def platform_mismatch(self, platform: "Platform") -> str | None:
        """Why this implementation is not for ``platform`` at all, or None."""
        if self.platforms and platform.name not in self.platforms:
            return f"for platforms {', '.join(self.platforms)}"
        if self.device_types and platform.device_type not in self.device_types:
            return f"for device types {', '.join(self.device_types)}"
        return None

    def refusal(self, ctx: OpContext) -> str | None:
        """Why this implementation does not serve ``ctx``, or None. ``supports`` may raise."""
        mismatch = self.platform_mismatch(ctx.platform)
        if mismatch is not None:
            return mismatch
        if self.dtypes and ctx.dtype not in self.dtypes:
            return "for dtypes " + ", ".join(str(d).removeprefix("torch.") for d in self.dtypes)
        if self.supports is not None:
            return self.supports(ctx)
        return None

    def load(self) -> Callable:
        """The function, imported if named by a string, with its signature checked."""
        fn = _import(self.fn)
        if not callable(fn):
            raise TypeError(f"{self.fn!r} is not callable")
        problem = signature_problem(fn, OP_SPECS[self.op].params)
        if problem is not None:
            raise TypeError(problem)
        return fn

    def load_repack(self) -> Callable | None:
        """``repack``, imported if named by a string (None without one)."""
        return None if self.repack is None else _import(self.repack)


def _is_target(target) -> bool:
    """A callable, or a ``"module:function"`` string naming one."""
    return callable(target) or (isinstance(target, str) and ":" in target)


def _import(target: Callable | str) -> Callable:
    if isinstance(target, str):
        module_name, _, attribute = target.partition(":")
        return getattr(importlib.import_module(module_name), attribute)
    return target


def signature_problem(fn: Callable, params: tuple[str, ...]) -> str | None:
    """Why ``fn`` cannot be called with the op's positional arguments, or None."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # a builtin without introspection: trust it
    try:
        signature.bind(*params)
    except TypeError as exc:
        return f"signature {signature} does not take the op's arguments ({', '.join(params)}): {exc}"
    return None
