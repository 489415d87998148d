"""The attention-backend interface (five members) and the batch it reads.

A backend owns the layout of the paged KV cache and the attention math over
it. The model runner describes each step's batch as flat tensors
(``AttentionBatch``); the backend turns that into whatever metadata it needs
once per step (``build_metadata``), then every attention layer calls
``forward``, which writes the step's keys and values into the cache and
attends over the cached context. The plain-torch backend
(``octavo.runtime.attention.torch_paged``) is the reference every other
backend is tested against.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch


@dataclass(frozen=True)
class AttentionSpec:
    """Everything about a model's attention that a backend must support."""

    num_heads: int
    num_kv_heads: int
    head_size: int
    scale: float
    dtype: torch.dtype
    kv_cache_dtype: torch.dtype
    block_size: int
    sliding_window: int | None = None
    # Scores become ``cap * tanh(scores / cap)`` after scaling (Gemma 2).
    logits_soft_cap: float | None = None
    # A learned logit per query head joins each row's softmax denominator
    # (gpt-oss's attention sinks): it takes probability mass but adds no
    # value. The layer hands its ``[num_heads]`` tensor to ``forward`` as
    # ``sinks=`` (per layer; layers of one spec share a backend).
    sinks: bool = False


@dataclass
class AttentionBatch:
    """One step's batch. Requests are laid out one after another in ``T`` tokens.

    Request ``i`` computes its tokens ``query_start_loc[i]:query_start_loc[i+1]``,
    which are the last ones of its ``seq_lens[i]`` tokens of context; its KV
    lives in blocks ``block_table[i]``; token ``t``'s KV goes to slot
    ``slot_mapping[t]`` (``block_id * block_size + offset``; negative = padding,
    not written).
    """

    query_start_loc: torch.Tensor  # [num_reqs + 1] int32, on the device
    seq_lens: torch.Tensor  # [num_reqs] int32, on the device
    block_table: torch.Tensor  # [num_reqs, max_blocks_per_req] int32, on the device
    slot_mapping: torch.Tensor  # [num_tokens] int64, on the device
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    # Host copies, for backends that plan on the CPU; None in a batch built for
    # graph capture, whose plan must hold for any step of its shape.
    query_start_loc_cpu: torch.Tensor | None = None
    seq_lens_cpu: torch.Tensor | None = None


class AttentionBackend(ABC):
    name: ClassVar[str]
    # True when ``build_metadata`` + ``forward`` can be captured in a graph:
    # no host synchronisation and no data-dependent shapes.
    supports_graph_capture: ClassVar[bool] = False

    # True when ``forward_with_rotary`` is implemented: the rotary embedding
    # applied in the kernel that writes the KV cache (one launch fewer a layer).
    # The attention layers then call it instead of ``forward``.
    fuses_rotary: ClassVar[bool] = False

    # True when ``set_kv_scales`` accepts scales other than 1.0 (plugin API 1.1).
    supports_kv_scales: ClassVar[bool] = False
    # True when ``forward`` honours ``spec.logits_soft_cap``. Declared rather
    # than left to ``supports`` so that a backend written before the option
    # existed is never chosen for a model that needs it.
    supports_logits_soft_cap: ClassVar[bool] = False
    # True when ``forward`` takes ``sinks=`` (``spec.sinks``), declared for
    # the same reason. Layers with sinks never call ``forward_with_rotary``.
    supports_sinks: ClassVar[bool] = False

    def __init__(self, spec: AttentionSpec) -> None:
        self.spec = spec
        self.k_scale = 1.0
        self.v_scale = 1.0

    def set_kv_scales(self, k_scale: float, v_scale: float) -> str | None:
        """Per-layer scales of a quantized (fp8) KV cache, set once after the
        weights load: the cache stores ``key / k_scale`` and ``value /
        v_scale``, and attention reads them multiplied back (``forward`` and
        ``forward_with_rotary``'s own writes included; the fused
        ``rotary_and_cache`` op does not scale, so layers with scales other
        than 1.0 call ``forward``). Returns why the backend cannot, or None."""
        if (k_scale, v_scale) != (1.0, 1.0) and not self.supports_kv_scales:
            return f"the {self.name} attention backend does not apply KV-cache scales"
        self.k_scale, self.v_scale = float(k_scale), float(v_scale)
        return None

    @classmethod
    @abstractmethod
    def supports(cls, spec: AttentionSpec) -> str | None:
        """``None`` if this backend can run ``spec``, else the reason it cannot."""

    @abstractmethod
    def kv_cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        """Shape of one layer's KV cache tensor for ``num_blocks`` blocks."""

    @abstractmethod
    def build_metadata(self, batch: AttentionBatch) -> Any:
        """Per-step metadata, shared by every layer; called once per step."""

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,  # [T, num_heads, head_size]
        key: torch.Tensor,  # [T, num_kv_heads, head_size]
        value: torch.Tensor,  # [T, num_kv_heads, head_size]
        kv_cache: torch.Tensor,
        metadata: Any,
    ) -> torch.Tensor:  # [T, num_heads, head_size]
        """Write ``key``/``value`` into ``kv_cache`` and attend over the context.

        A backend with ``supports_sinks`` also takes ``sinks=`` (``[num_heads]``,
        this rank's heads; passed only for a spec with ``sinks``)."""

    def forward_with_rotary(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: Any,
        positions: torch.Tensor,  # [T]
        cos_sin_cache: torch.Tensor,  # [max_position, head_size]: cos then sin halves, float32
        rotary_and_cache: Callable,
    ) -> torch.Tensor:
        """Optional (``fuses_rotary``): rotate ``query`` and ``key`` (GPT-NeoX
        "rotate half" layout) at ``positions``, then as ``forward``. Called by
        the model's attention layers in place of their own rotary step.

        ``rotary_and_cache`` (plugin API 1.1) is the model's resolved layer op
        of that name: it rotates ``query`` and writes the rotated keys and the
        values into a cache of the standard layout ``[2, num_blocks,
        block_size, Hkv, D]`` at the step's slots, returning the rotated
        query; a backend with that layout calls it, then attends without
        writing. A 1.0 backend's method without this parameter is still
        called, with seven arguments."""
        raise NotImplementedError(f"{self.name} does not fuse the rotary embedding")


def backend_refusal(backend_class: type[AttentionBackend], spec: AttentionSpec) -> str | None:
    """Why ``backend_class`` cannot run ``spec`` (None: it can)."""
    if spec.logits_soft_cap is not None and not backend_class.supports_logits_soft_cap:
        return "no logit soft-capping"
    if spec.sinks and not backend_class.supports_sinks:
        return "no attention sinks"
    return backend_class.supports(spec)


def kv_cache_bytes_per_block(spec: AttentionSpec, num_layers: int) -> int:
    """Bytes one block costs across all layers (keys and values)."""
    element_size = torch.empty((), dtype=spec.kv_cache_dtype).element_size()
    return 2 * spec.block_size * spec.num_kv_heads * spec.head_size * element_size * num_layers
