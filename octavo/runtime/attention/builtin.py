"""The in-tree attention backends, as the built-in plugin registers them."""

from __future__ import annotations


def builtin_attention_backends() -> dict[str, type]:
    from octavo.runtime.attention.torch_paged import TorchPagedAttention
    from octavo.runtime.attention.triton_paged import TritonPagedAttention

    return {TorchPagedAttention.name: TorchPagedAttention, TritonPagedAttention.name: TritonPagedAttention}
