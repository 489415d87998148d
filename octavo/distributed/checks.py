"""Whether a model can be split the way the user asked, checked before any
worker starts, so that a bad ``tensor_parallel_size`` or
``pipeline_parallel_size`` is a clear ``InvalidArgumentError`` and not a
failure inside N worker processes.

Tensor parallelism splits attention heads, KV heads and MLP features evenly.
With fewer KV heads than ranks, each KV head is replicated on
``tp / num_kv_heads`` ranks, which needs ``tp`` to be a multiple of them
(e.g. 1 KV head at TP=2). Pipeline parallelism needs at least one layer per
stage.
"""

from __future__ import annotations

from octavo.errors import InvalidArgumentError
from octavo.models.config import ModelArchConfig


def check_parallel_config(arch: ModelArchConfig, tp: int, pp: int) -> None:
    name = arch.architecture
    if arch.num_attention_heads % tp:
        raise InvalidArgumentError(
            f"tensor_parallel_size={tp} does not divide the {arch.num_attention_heads} attention heads of {name}",
            param="tensor_parallel_size",
        )
    kv = arch.num_key_value_heads
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        raise InvalidArgumentError(
            f"tensor_parallel_size={tp} cannot split the {kv} KV heads of {name}: it must divide them, "
            f"or be a multiple of them (then each KV head is replicated); "
            f"sizes that work: {', '.join(str(t) for t in _working_tp_sizes(arch))}",
            param="tensor_parallel_size",
        )
    if arch.intermediate_size % tp:
        raise InvalidArgumentError(
            f"tensor_parallel_size={tp} does not divide the MLP size {arch.intermediate_size} of {name}",
            param="tensor_parallel_size",
        )
    if pp > arch.num_hidden_layers:
        raise InvalidArgumentError(
            f"pipeline_parallel_size={pp} exceeds the {arch.num_hidden_layers} layers of {name}",
            param="pipeline_parallel_size",
        )


def _working_tp_sizes(arch: ModelArchConfig) -> list[int]:
    sizes = []
    for tp in range(1, arch.num_attention_heads + 1):
        kv = arch.num_key_value_heads
        kv_ok = kv % tp == 0 if kv >= tp else tp % kv == 0
        if arch.num_attention_heads % tp == 0 and kv_ok and arch.intermediate_size % tp == 0:
            sizes.append(tp)
    return sizes
