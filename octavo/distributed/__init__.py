"""Process groups and collectives for tensor and pipeline parallelism."""

from octavo.distributed.parallel_state import (
    get_pp_group,
    get_tp_group,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)

__all__ = [
    "get_pp_group",
    "get_tp_group",
    "tensor_model_parallel_all_gather",
    "tensor_model_parallel_all_reduce",
]
