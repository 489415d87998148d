"""Activations between pipeline stages: point-to-point send and receive.

Invariants:
- Tensor rank ``t`` of stage ``s`` talks only to tensor rank ``t`` of stages
  ``s - 1`` and ``s + 1`` (after the row-parallel all-reduce every tensor rank
  of a stage holds the same full hidden states).
- Nothing but tensors crosses: the receiver knows the shape from the
  scheduler output it got from the engine (``num_tokens`` x ``hidden_size``)
  and the dtype from the model config, so no metadata message is needed.
- Hidden states and residual travel stacked as one tensor: one send per
  batch and stage boundary.
- Sends block until the next stage has taken the batch. Every stage handles
  batches in the engine's order, so a stage that runs ahead simply waits.
"""

from __future__ import annotations

import torch

from octavo.distributed.parallel_state import get_pp_group


def _neighbour(offset: int) -> int:
    pp = get_pp_group()
    return pp.ranks[pp.rank + offset]


def send_intermediate(hidden: torch.Tensor, residual: torch.Tensor) -> None:
    import torch.distributed as dist

    dist.send(torch.stack([hidden, residual]).contiguous(), dst=_neighbour(+1))


def recv_intermediate(
    num_tokens: int, hidden_size: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    import torch.distributed as dist

    buffer = torch.empty(2, num_tokens, hidden_size, dtype=dtype, device=device)
    dist.recv(buffer, src=_neighbour(-1))
    return buffer[0], buffer[1]
