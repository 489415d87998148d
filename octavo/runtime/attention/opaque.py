"""Attention as one opaque op, for steps compiled with ``torch.compile``.

A traced graph handles paged attention badly: the backends size tensors from
host-side lengths, read a device value before the KV write (``torch_paged``)
and write into the KV cache in place. ``OpaqueAttention`` wraps a
platform's backend so that each layer's attention is one registered op,
``octavo::attention``: the compiler sees its inputs and an output shaped
like the query and calls into the wrapped backend, which runs eagerly. So
the compiled graph's shapes depend on the number of tokens only, not on
contexts or requests, and the rest of the model (norms, rotary, MLPs,
projections) is compiled around it.

The step's metadata does not pass through the graph: ``build_metadata``
(called by the runner once per step, before the compiled call) keeps it
for the step, and the op reads it from there. The op declares that it
mutates the KV cache, so the compiler orders it correctly and reuses the
cache in place.
"""

from __future__ import annotations

from typing import Any

import torch

from octavo.core.attention import AttentionBackend, AttentionBatch, AttentionSpec

# Wrapped backends by index (the op's integer argument), and the step's metadata.
_BACKENDS: list[AttentionBackend] = []
_STEP: dict[str, Any] = {"metadata": None}


@torch.library.custom_op("octavo::attention", mutates_args=("kv_cache",))
def opaque_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, backend_index: int
) -> torch.Tensor:
    out = _BACKENDS[backend_index].forward(query, key, value, kv_cache, _STEP["metadata"])
    # A custom op's output may not alias its inputs.
    return out.clone() if out.data_ptr() in (query.data_ptr(), key.data_ptr(), value.data_ptr()) else out


@opaque_attention.register_fake
def _(query, key, value, kv_cache, backend_index):
    return torch.empty_like(query)


class OpaqueAttention(AttentionBackend):
    """``inner`` with its ``forward`` behind ``octavo::attention``; everything else is ``inner``'s."""

    name = "opaque"

    def __init__(self, inner: AttentionBackend) -> None:
        super().__init__(inner.spec)
        self.inner = inner
        self.name = f"{inner.name} (opaque op)"
        self.index = len(_BACKENDS)
        _BACKENDS.append(inner)

    @classmethod
    def supports(cls, spec: AttentionSpec) -> str | None:
        return None  # the wrapped backend was already chosen for this spec

    def kv_cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        return self.inner.kv_cache_shape(num_blocks)

    def build_metadata(self, batch: AttentionBatch) -> Any:
        metadata = self.inner.build_metadata(batch)
        _STEP["metadata"] = metadata
        return metadata

    def forward(self, query, key, value, kv_cache, metadata) -> torch.Tensor:
        return opaque_attention(query, key, value, kv_cache, self.index)
