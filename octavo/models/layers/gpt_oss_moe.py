"""gpt-oss's mixture-of-experts block: a router with a bias, experts with
biases, and a clamped SwiGLU.

What differs from ``layers/moe.py``'s block (facts from transformers'
``modeling_gpt_oss.py``):

* the router is ``x @ W.T + b`` (``mlp.router.weight`` / ``.bias``); each
  token takes the ``k`` largest logits and a softmax over those ``k`` alone
  (the same weights as the top ``k`` of a softmax over all, renormalised);
* each expert computes ``gate_up = x @ W13 + b13`` and
  ``(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)`` with
  ``g = clamp(gate, max=limit)`` (``swiglu_alpha`` 1.702, ``swiglu_limit``
  7.0), then ``down = h @ W2 + b2``;
* the checkpoint stacks all experts with the input dimension first:
  ``experts.gate_up_proj`` ``[E, hidden, 2 * I]`` whose columns interleave
  gate and up (gate ``0::2``, up ``1::2``), ``gate_up_proj_bias`` ``[E, 2 * I]``
  likewise, ``down_proj`` ``[E, I, hidden]``, ``down_proj_bias`` ``[E, hidden]``.
  Loading transposes them into ``FusedMoE``'s layout (``w13_weight``
  ``[E, 2 * I, hidden]``, gate rows then up rows; ``w2_weight``
  ``[E, hidden, I]``), so tensor and expert parallelism split them as they
  split every other family's experts.

The experts run in plain torch (``clamped_swiglu_experts``) on every
platform: the Triton ``fused_moe`` kernels have no biases and no clamped
activation, so the ``fused_moe`` layer op is never called for this block.
Correct everywhere; on a GPU, one launch sequence per expert that has tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.distributed.parallel_state import get_tp_group, tensor_model_parallel_all_reduce
from octavo.errors import ModelLoadError
from octavo.models.layers.moe import FusedMoE
from octavo.models.moe_config import MoEConfig
from octavo.ops import LayerOps


def clamped_swiglu(gate_up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """``[T, 2 I]`` (gate half, then up half) -> ``[T, I]``, gpt-oss's activation."""
    gate, up = gate_up.chunk(2, dim=-1)
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def clamped_swiglu_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    b13: torch.Tensor,
    w2: torch.Tensor,
    b2: torch.Tensor | None,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    alpha: float,
    limit: float,
) -> torch.Tensor:
    """The routed experts' weighted sum, biases and clamped SwiGLU included.

    ``x`` ``[T, H]``; ``w13`` ``[E, 2 I, H]`` (gate rows, then up rows),
    ``b13`` ``[E, 2 I]``; ``w2`` ``[E, H, I]``, ``b2`` ``[E, H]`` or None (a
    tensor-parallel rank other than the first: the bias is added once);
    ``topk_weights`` ``[T, K]`` float32, ``topk_ids`` ``[T, K]`` in ``[0, E)``
    or -1 (an expert held by another rank: that slot adds nothing). Each
    expert's output is computed in ``x.dtype``, scaled by its weight cast to
    ``x.dtype`` and summed in expert order, as Hugging Face's loop does.
    """
    num_experts, top_k = w13.shape[0], topk_ids.shape[1]
    out = torch.zeros_like(x)
    flat_ids = topk_ids.reshape(-1).to(torch.long)
    held = flat_ids >= 0
    # Slots sorted by expert, and each expert's count: one host read for all experts.
    order = torch.argsort(torch.where(held, flat_ids, num_experts), stable=True)
    counts = torch.bincount(flat_ids[held], minlength=num_experts).tolist()
    weights = topk_weights.reshape(-1).to(x.dtype)
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        slots = order[start : start + count]
        start += count
        tokens = slots // top_k
        hidden = clamped_swiglu(F.linear(x[tokens], w13[expert], b13[expert]), alpha, limit)
        bias = None if b2 is None else b2[expert]
        out.index_add_(0, tokens, F.linear(hidden, w2[expert], bias) * weights[slots, None])
    return out


class GptOssExperts(FusedMoE):
    """``FusedMoE``'s stacked weights plus biases, loaded from gpt-oss's layout."""

    def __init__(
        self, moe: MoEConfig, hidden_size: int, dtype: torch.dtype, expert_parallel: bool, prefix: str,
        alpha: float, limit: float, ops: LayerOps | None = None,
    ) -> None:
        super().__init__(moe, hidden_size, dtype, expert_parallel, prefix, "silu", ops)
        self.alpha, self.limit = float(alpha), float(limit)
        inter = self.local_intermediate_size
        self.w13_bias = nn.Parameter(torch.zeros(self.num_local_experts, 2 * inter, dtype=dtype), requires_grad=False)
        self.w2_bias = nn.Parameter(torch.zeros(self.num_local_experts, hidden_size, dtype=dtype), requires_grad=False)
        for param in (self.w13_bias, self.w2_bias):
            param.weight_loader = self.bias_loader

    def _local_experts(self) -> range:
        return range(self.first_expert, self.first_expert + self.num_local_experts)

    def _check(self, what: str, loaded: torch.Tensor, shape: tuple[int, ...]) -> None:
        if tuple(loaded.shape) != shape:
            raise ModelLoadError(f"{self.prefix}: {what} has shape {tuple(loaded.shape)}, expected {shape}")

    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor, shard_id) -> None:
        """``experts.gate_up_proj`` ``[E, H, 2 I]`` (interleaved) or
        ``experts.down_proj`` ``[E, I, H]``: all experts in one tensor."""
        expert, part = shard_id
        if expert != "all":
            raise ModelLoadError(f"{self.prefix}: gpt-oss experts are stacked in one tensor, not stored one by one")
        num, hidden = self.num_experts, self.hidden_size
        inter, size = self.intermediate_size, self.local_intermediate_size
        columns = slice(self.tp_rank * size, (self.tp_rank + 1) * size)
        if part == "down":
            self._check("down_proj", loaded, (num, inter, hidden))
            for e in self._local_experts():
                param.data[e - self.first_expert].copy_(loaded[e, columns].transpose(0, 1))
            return
        self._check("gate_up_proj", loaded, (num, hidden, 2 * inter))
        for e in self._local_experts():
            # [2 I, H]: gate and up rows interleaved
            self._copy_deinterleaved(param.data[e - self.first_expert], loaded[e].transpose(0, 1), columns)

    def _copy_deinterleaved(self, target: torch.Tensor, rows: torch.Tensor, columns: slice) -> None:
        """``rows`` interleave gate (even) and up (odd) along dim 0: this rank's
        ``columns`` of each, gate first then up, into ``target``."""
        size = self.local_intermediate_size
        target[:size].copy_(rows[0::2][columns])
        target[size:].copy_(rows[1::2][columns])

    def bias_loader(self, param: torch.Tensor, loaded: torch.Tensor, shard_id=None) -> None:
        num, size = self.num_experts, self.local_intermediate_size
        if param is self.w2_bias:
            self._check("down_proj_bias", loaded, (num, self.hidden_size))
            param.data.copy_(loaded[self.first_expert : self.first_expert + self.num_local_experts])
            return
        self._check("gate_up_proj_bias", loaded, (num, 2 * self.intermediate_size))
        columns = slice(self.tp_rank * size, (self.tp_rank + 1) * size)
        for e in self._local_experts():
            self._copy_deinterleaved(param.data[e - self.first_expert], loaded[e], columns)

    def forward(self, hidden: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        # Tensor parallel: every rank holds a slice of every expert, and the
        # down bias is added by the first rank only (the all-reduce sums them).
        down_bias = self.w2_bias if self.tp_rank == 0 else None
        return clamped_swiglu_experts(
            hidden, self.w13_weight, self.w13_bias, self.w2_weight, down_bias, topk_weights,
            self.local_ids(topk_ids), self.alpha, self.limit,
        )


class BiasedRouter(nn.Module):
    """The router's logits ``x @ weight.T + bias`` in the model's dtype, as HF computes them."""

    def __init__(self, num_experts: int, hidden_size: int, dtype: torch.dtype, ops: LayerOps) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size, dtype=dtype), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(num_experts, dtype=dtype), requires_grad=False)
        self.linear_op = ops.linear

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear_op(hidden, self.weight, self.bias)


class GptOssMoeBlock(nn.Module):
    """Router + experts of one gpt-oss layer, summed over the TP group."""

    def __init__(self, ctx, prefix: str) -> None:
        super().__init__()
        config, moe = ctx.config, ctx.config.moe
        self.top_k = moe.top_k
        self.router = BiasedRouter(moe.num_experts, config.hidden_size, ctx.dtype, ctx.ops)
        self.experts = GptOssExperts(
            moe, config.hidden_size, ctx.dtype, ctx.expert_parallel, f"{prefix}.experts",
            config.raw.get("swiglu_alpha", 1.702), config.raw.get("swiglu_limit", 7.0), ctx.ops,
        )
        self.tp_size = get_tp_group().world_size

    def route(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights float32 ``[T, k]``, ids int32 ``[T, k]``): softmax over the top-k logits."""
        top, ids = torch.topk(self.router(hidden), self.top_k, dim=-1)
        return torch.softmax(top, dim=-1, dtype=torch.float32), ids.to(torch.int32)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(hidden)
        out = self.experts(hidden, weights, ids)
        return tensor_model_parallel_all_reduce(out) if self.tp_size > 1 else out
