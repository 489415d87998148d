"""Whether a model can be split the way the user asked, checked before any
worker starts, so that a bad ``tensor_parallel_size`` or
``pipeline_parallel_size`` is a clear ``InvalidArgumentError`` and not a
failure inside N worker processes.

Tensor parallelism splits attention heads, KV heads and MLP features evenly.
With fewer KV heads than ranks, each KV head is replicated on
``tp / num_kv_heads`` ranks, which needs ``tp`` to be a multiple of them
(e.g. 1 KV head at TP=2). Pipeline parallelism needs at least one layer per
stage. Mixture-of-experts layers split each expert's MLP like a dense one,
or, with expert parallelism, hand each rank whole experts, which needs the
number of experts to be a multiple of the ranks.
"""

from __future__ import annotations

import logging

from octavo.errors import InvalidArgumentError
from octavo.models.config import ModelArchConfig

logger = logging.getLogger(__name__)


def check_parallel_config(arch: ModelArchConfig, tp: int, pp: int, expert_parallel: bool = False) -> None:
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
    if arch.intermediate_size % tp and (arch.moe is None or not all(arch.moe.sparse_layers)):
        raise InvalidArgumentError(
            f"tensor_parallel_size={tp} does not divide the MLP size {arch.intermediate_size} of {name}",
            param="tensor_parallel_size",
        )
    _check_experts(arch, tp, expert_parallel)
    if pp > arch.num_hidden_layers:
        raise InvalidArgumentError(
            f"pipeline_parallel_size={pp} exceeds the {arch.num_hidden_layers} layers of {name}",
            param="pipeline_parallel_size",
        )


def _check_experts(arch: ModelArchConfig, tp: int, expert_parallel: bool) -> None:
    moe, name = arch.moe, arch.architecture
    if moe is None:
        if expert_parallel:
            logger.warning("enable_expert_parallel: %s has no experts; the option changes nothing", name)
        return
    if expert_parallel and moe.num_experts % tp:
        raise InvalidArgumentError(
            f"enable_expert_parallel: tensor_parallel_size={tp} does not divide the {moe.num_experts} experts of {name}",
            param="tensor_parallel_size",
        )
    sizes = [("shared expert size", moe.shared_expert_intermediate_size)]
    if not expert_parallel:
        sizes.append(("expert size", moe.intermediate_size))
    for what, size in sizes:
        if size % tp:
            raise InvalidArgumentError(
                f"tensor_parallel_size={tp} does not divide the {what} {size} of {name}", param="tensor_parallel_size"
            )


def _working_tp_sizes(arch: ModelArchConfig) -> list[int]:
    sizes = []
    for tp in range(1, arch.num_attention_heads + 1):
        kv = arch.num_key_value_heads
        kv_ok = kv % tp == 0 if kv >= tp else tp % kv == 0
        if arch.num_attention_heads % tp == 0 and kv_ok and arch.intermediate_size % tp == 0:
            sizes.append(tp)
    return sizes
