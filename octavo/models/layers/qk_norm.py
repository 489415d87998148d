"""RMSNorm over all heads of q (or k) at once, split across tensor-parallel ranks.

OLMo 2 and OLMoE normalise the whole q projection (every head together)
before it is cut into heads, not each head on its own. With tensor
parallelism each rank holds only its heads, so the mean square is summed
over the ranks (one all-reduce of a [T, 1] tensor) before scaling. KV heads
replicated over ``num_replicas`` ranks (fewer KV heads than ranks) are
counted once: the sum over ranks is divided by the number of copies.
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.distributed.parallel_state import get_tp_group, tensor_model_parallel_all_reduce
from octavo.errors import ModelLoadError


class ShardedRMSNorm(nn.Module):
    def __init__(
        self, total_size: int, eps: float, dtype: torch.dtype, scale_in_float32: bool, num_replicas: int = 1
    ) -> None:
        super().__init__()
        tp = get_tp_group()
        self.tp_size, self.num_replicas = tp.world_size, num_replicas
        self.num_shards = tp.world_size // num_replicas
        self.shard = tp.rank // num_replicas
        self.total_size, self.eps = total_size, eps
        self.scale_in_float32 = scale_in_float32
        self.weight = nn.Parameter(torch.ones(total_size // self.num_shards, dtype=dtype), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor, shard_id=None) -> None:
        if loaded.shape != (self.total_size,):
            raise ModelLoadError(f"q/k norm: checkpoint tensor has shape {tuple(loaded.shape)}, expected ({self.total_size},)")
        size = param.shape[0]
        param.data.copy_(loaded.narrow(0, self.shard * size, size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.to(torch.float32)
        if self.tp_size == 1:
            variance = x32.pow(2).mean(-1, keepdim=True)
        else:
            squares = tensor_model_parallel_all_reduce(x32.pow(2).sum(-1, keepdim=True))
            variance = squares / (self.num_replicas * self.total_size)
        x32 = x32 * torch.rsqrt(variance + self.eps)
        if self.scale_in_float32:
            return (x32 * self.weight.to(torch.float32)).to(x.dtype)
        return self.weight * x32.to(x.dtype)
