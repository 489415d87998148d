"""Tensor- and pipeline-parallel groups of this process.

Without ``initialize_model_parallel`` every group is the trivial group of one
rank, so single-device code needs no special cases: collectives on a group of
one return their input.

Rank layout (global rank = ``pp_rank * tp_size + tp_rank``): a pipeline stage
is ``tp_size`` consecutive ranks; tensor rank ``t`` of stage ``s`` sends its
activations to tensor rank ``t`` of stage ``s + 1``. The rank that returns
sampled tokens (the *output rank*) is tensor rank 0 of the last stage.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class GroupInfo:
    rank: int = 0
    world_size: int = 1
    group: object | None = None  # a torch.distributed ProcessGroup
    ranks: tuple[int, ...] = (0,)

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    @property
    def is_last(self) -> bool:
        return self.rank == self.world_size - 1


_TP = GroupInfo()
_PP = GroupInfo()


def get_tp_group() -> GroupInfo:
    return _TP


def get_pp_group() -> GroupInfo:
    return _PP


def set_groups(tp: GroupInfo, pp: GroupInfo) -> None:
    global _TP, _PP
    _TP, _PP = tp, pp


def reset_groups() -> None:
    set_groups(GroupInfo(), GroupInfo())


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    if _TP.world_size == 1:
        return x
    import torch.distributed as dist

    dist.all_reduce(x, group=_TP.group)
    return x


def tensor_model_parallel_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    if _TP.world_size == 1:
        return x
    import torch.distributed as dist

    parts = [torch.empty_like(x) for _ in range(_TP.world_size)]
    dist.all_gather(parts, x.contiguous(), group=_TP.group)
    return torch.cat(parts, dim=dim)


def output_rank(tp_size: int, pp_size: int) -> int:
    """The global rank whose ``ModelRunnerOutput`` the engine uses."""
    return (pp_size - 1) * tp_size


def init_distributed_environment(
    rank: int, world_size: int, init_method: str, backend: str, timeout_s: float = 600.0
) -> None:
    """Join the process group (idempotent for an already-initialised process)."""
    import datetime

    import torch.distributed as dist

    if dist.is_initialized():
        return
    dist.init_process_group(
        backend=backend,
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def initialize_model_parallel(tp_size: int, pp_size: int) -> None:
    """Build the TP and PP groups of this process from the world group.

    Every rank must call this with the same sizes: ``new_group`` is itself a
    collective over the world, so all groups are created on all ranks in the
    same order.
    """
    import torch.distributed as dist

    world_size, rank = dist.get_world_size(), dist.get_rank()
    if tp_size * pp_size != world_size:
        raise ValueError(f"tp_size * pp_size = {tp_size * pp_size} but the world has {world_size} ranks")
    tp_info = pp_info = None
    for stage in range(pp_size):
        ranks = tuple(range(stage * tp_size, (stage + 1) * tp_size))
        group = dist.new_group(list(ranks)) if tp_size > 1 else None
        if rank in ranks:
            tp_info = GroupInfo(ranks.index(rank), tp_size, group, ranks)
    for tp_rank in range(tp_size):
        ranks = tuple(stage * tp_size + tp_rank for stage in range(pp_size))
        group = dist.new_group(list(ranks)) if pp_size > 1 else None
        if rank in ranks:
            pp_info = GroupInfo(ranks.index(rank), pp_size, group, ranks)
    set_groups(tp_info, pp_info)


def destroy_distributed_environment() -> None:
    import torch.distributed as dist

    reset_groups()
    if dist.is_initialized():
        dist.destroy_process_group()
