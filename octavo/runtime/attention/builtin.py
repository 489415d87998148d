"""The in-tree attention backends, as the built-in plugin registers them."""

from __future__ import annotations


def builtin_attention_backends() -> dict[str, type]:
    from octavo.runtime.attention.torch_paged import TorchPagedAttention
    from octavo.runtime.attention.triton_paged import TritonPagedAttention
    from octavo.runtime.attention.triton_sdpa_prefill import TritonSdpaPrefillAttention

    backends = (TorchPagedAttention, TritonPagedAttention, TritonSdpaPrefillAttention)
    return {backend.name: backend for backend in backends}
