"""Tensor- and pipeline-parallel groups of this process.

Without ``initialize_model_parallel`` every group is the trivial group of one
rank, so single-device code needs no special cases: collectives on a group of
one return their input.
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
