"""``LayerOps``: the table of resolved layer ops one model's layers call.

The model builder resolves every op once (``resolution.resolve_layer_ops``)
and builds the model inside ``layer_ops_scope(table)``; each layer takes the
table when it is constructed (``current_layer_ops()``) and keeps it, so a
process can hold several models with different tables, and nothing is set
on a module after it is built. Outside any scope (a layer built on its own,
in a test or a tool) the table of references applies.

Calls go straight to the resolved callable: an op with no per-call
condition is the implementation's own function; one with ``max_tokens``
is a small closure that compares one integer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field, fields

from octavo.ops.specs import OP_SPECS


@dataclass(frozen=True)
class ChainStep:
    """One implementation in an op's resolved chain."""

    impl: str
    plugin: str
    condition: str = ""  # per call, e.g. "up to 1 token"; "" = every call

    def describe(self) -> str:
        return f"{self.impl} [{self.plugin}]" + (f" {self.condition}" if self.condition else "")


@dataclass(frozen=True)
class WeightLayout:
    """An implementation with weights in its own layout (``OpImpl.repack``):
    the layers it takes hold their weights that way and call ``fn``."""

    fn: Callable
    repack: Callable
    label: str  # "name [plugin]"


@dataclass(frozen=True)
class OpChoice:
    """What was resolved for one op, for logs, ``octavo env`` and the conformance kit."""

    op: str
    chain: tuple[ChainStep, ...] = ()
    # Where calls the chain declines go: "reference", "composed (a, b)", or
    # None when the chain's last implementation serves every call.
    fallback: str | None = "reference"
    skipped: tuple[str, ...] = ()  # "name [plugin] (why)" for the ones that do not serve here
    forced: bool = False
    layout: str | None = None  # "name [plugin]" of the weight layout the layers it takes hold

    @property
    def impl(self) -> str:
        return self.chain[0].impl if self.chain else str(self.fallback)

    @property
    def plugin(self) -> str | None:
        return self.chain[0].plugin if self.chain else None

    def describe(self) -> str:
        parts = [step.describe() for step in self.chain]
        if self.fallback is not None:
            parts.append(self.fallback)
        layout = "" if self.layout is None else f"{self.layout} in its own weight layout for the layers it takes; others: "
        text = f"{self.op}: {layout}" + ", else ".join(parts)
        return text + (" (forced by OCTAVO_LAYER_OPS)" if self.forced else "")

    @property
    def is_reference(self) -> bool:
        """True when every call runs the reference (no implementation serves)."""
        return not self.chain and self.fallback == "reference" and self.layout is None


@dataclass(frozen=True)
class LayerOps:
    """One callable per op (signatures: ``octavo.ops.specs.OP_SPECS``)."""

    rms_norm: Callable
    fused_add_rms_norm: Callable
    rms_norm_f32_scale: Callable
    fused_add_rms_norm_f32_scale: Callable
    post_norm_add_rms_norm_f32_scale: Callable
    rotary_embedding: Callable
    rotary_and_cache: Callable
    silu_and_mul: Callable
    gelu_and_mul: Callable
    gelu_tanh_and_mul: Callable
    linear: Callable
    linear_silu_and_mul: Callable
    linear_gelu_tanh_and_mul: Callable
    moe_topk_softmax: Callable
    fused_moe: Callable
    fp8_linear: Callable
    fp8_block_linear: Callable
    int8_linear: Callable
    int8_weight_only_linear: Callable
    int4_linear: Callable
    int8_grouped_linear: Callable
    gguf_linear: Callable
    fused_add_rms_norm_fp8_linear: Callable
    silu_and_mul_fp8_linear: Callable
    encoder_attention: Callable
    fused_moe_routed: Callable
    qk_rms_norm: Callable
    fused_add_rms_norm_linear: Callable
    fused_add_rms_norm_route: Callable
    layer_norm: Callable
    choices: dict[str, OpChoice] = field(default_factory=dict, compare=False)
    layouts: dict[str, WeightLayout] = field(default_factory=dict, compare=False)

    def choice(self, op: str) -> OpChoice:
        return self.choices.get(op) or OpChoice(op)

    def layout(self, op: str) -> WeightLayout | None:
        """The implementation of ``op`` with its own weight layout, if one serves this model."""
        return self.layouts.get(op)

    def describe(self) -> list[str]:
        return [self.choice(op).describe() for op in OP_SPECS]


OP_FIELDS = tuple(f.name for f in fields(LayerOps) if f.name not in ("choices", "layouts"))
assert OP_FIELDS == tuple(OP_SPECS), "LayerOps fields and OP_SPECS must list the same ops in the same order"


_current: ContextVar[LayerOps | None] = ContextVar("octavo_layer_ops", default=None)


@contextlib.contextmanager
def layer_ops_scope(ops: LayerOps) -> Iterator[LayerOps]:
    """Layers constructed inside this block take ``ops``."""
    token = _current.set(ops)
    try:
        yield ops
    finally:
        _current.reset(token)


def current_layer_ops() -> LayerOps:
    """The table layers built now take: the scope's, else the references."""
    from octavo.ops.dispatch import reference_layer_ops

    return _current.get() or reference_layer_ops()
