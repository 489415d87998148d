"""The mixture-of-experts layer: router, experts, optional shared expert.

Each token's router logits pick ``top_k`` of ``num_experts`` experts
(softmax over all experts, the top ``k`` probabilities, optionally divided
by their sum); the token's output is the routing-weighted sum of those
experts' SwiGLU MLPs. Expert weights are stacked: ``w13_weight`` is
``[experts, 2 * intermediate, hidden]`` (gate rows, then up rows) and
``w2_weight`` ``[experts, hidden, intermediate]``, so a grouped kernel can
run every expert in two launches. Both steps are layer ops resolved for
the model (``octavo.ops``): ``moe_topk_softmax`` (the router's softmax and
top-k) and ``fused_moe`` (the experts' weighted sum; Octavo's Triton kernel
on CUDA/ROCm, the reference loop over experts elsewhere). DeepSeek's
grouped routing (``grouped_select_experts``) is plain torch.

Parallelism over the tensor-parallel group, whose ranks all see every token:

* tensor parallel (default): every rank holds every expert, each a slice of
  the intermediate dimension (as a dense MLP is split); partial outputs are
  summed by one all-reduce;
* expert parallel (``expert_parallel=True``): rank ``r`` holds whole experts
  ``[r * E / n, (r + 1) * E / n)`` and computes only the tokens routed to
  them (other ids are -1 in its local view); the all-reduce that sums the
  ranks' partial outputs delivers each token its experts' results.

Invariant: ``topk_ids`` handed to the experts are local expert indices in
``[0, num_local_experts)`` or -1 (the expert lives on another rank).
"""

from __future__ import annotations

import re

import torch
from torch import nn

from octavo.distributed.parallel_state import get_tp_group, tensor_model_parallel_all_reduce
from octavo.errors import ModelLoadError
from octavo.models.layers.linear import ReplicatedLinear
from octavo.models.moe_config import MoEConfig
from octavo.ops import LayerOps, current_layer_ops

# Hugging Face ``hidden_act`` -> the ``fused_moe`` op's activation name.
_EXPERT_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh"}

# Checkpoint names of one expert's projections: Mixtral's w1/w3/w2 or
# gate/up/down_proj; transformers 5 may also save all experts stacked.
_EXPERT_WEIGHT = re.compile(r"\.experts\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$")
_STACKED_EXPERTS = re.compile(r"\.experts\.(gate_up_proj|down_proj)$")
_SHARDS = {"w1": 0, "gate_proj": 0, "w3": 1, "up_proj": 1, "w2": "down", "down_proj": "down"}


def expert_param_name(name: str) -> tuple[str, object] | None:
    """Checkpoint name -> (parameter name, shard id) for expert weights, else None.

    Shard ids: ``(expert, 0)`` gate, ``(expert, 1)`` up, ``(expert, "down")``,
    ``("all", "gate_up")`` / ``("all", "down")`` for stacked tensors.
    """
    match = _EXPERT_WEIGHT.search(name)
    if match:
        target = "w2_weight" if _SHARDS[match.group(2)] == "down" else "w13_weight"
        return name[: match.start()] + f".experts.{target}", (int(match.group(1)), _SHARDS[match.group(2)])
    match = _STACKED_EXPERTS.search(name)
    if match:
        target = "w13_weight" if match.group(1) == "gate_up_proj" else "w2_weight"
        return name[: match.start()] + f".experts.{target}", ("all", "gate_up" if target == "w13_weight" else "down")
    return None


def grouped_select_experts(
    router_logits: torch.Tensor, correction_bias: torch.Tensor | None, moe: MoEConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek's routing (see ``moe_config``): (weights float32 [T, k], ids int32 [T, k])."""
    logits = router_logits.to(torch.float32)
    scores = logits.sigmoid() if moe.scoring == "sigmoid" else logits.softmax(dim=-1)
    choice = scores if correction_bias is None else scores + correction_bias
    if moe.num_groups > 1:
        grouped = choice.view(-1, moe.num_groups, moe.num_experts // moe.num_groups)
        if moe.group_score == "top2_sum":
            group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
        else:
            group_scores = grouped.max(dim=-1).values
        kept = torch.topk(group_scores, moe.topk_groups, dim=-1, sorted=False).indices
        mask = torch.zeros_like(group_scores).scatter_(1, kept, 1.0).bool()
        mask = mask[:, :, None].expand_as(grouped).reshape(-1, moe.num_experts)
        # V3 drops the other groups' experts from the choice; V2 zeroes their scores.
        choice = choice.masked_fill(~mask, float("-inf") if correction_bias is not None else 0.0)
    ids = torch.topk(choice, moe.top_k, dim=-1, sorted=False).indices
    # V3's weights are the unbiased scores; V2's are its (masked) choice scores.
    weights = (scores if correction_bias is not None else choice).gather(1, ids)
    if moe.renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * moe.routed_scaling_factor, ids.to(torch.int32)


class Router(nn.Module):
    """The router's logits ``x @ weight.T`` (never quantized); DeepSeek V3's
    correction bias lives here too, under its checkpoint name.

    The product is the ``linear`` layer op the dense layers use (the GEMV
    kernel at decode where the platform has one, ``F.linear`` elsewhere),
    in the router's dtype as Hugging Face computes it: the model's for
    Mixtral, Qwen-MoE and OLMoE (an ``nn.Linear`` of the layer), float32
    for DeepSeek (its gate casts both operands)."""

    def __init__(self, moe: MoEConfig, hidden_size: int, dtype: torch.dtype, ops: LayerOps | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(moe.num_experts, hidden_size, dtype=dtype), requires_grad=False)
        self.e_score_correction_bias = None
        if moe.correction_bias:
            self.e_score_correction_bias = nn.Parameter(torch.zeros(moe.num_experts, dtype=torch.float32), requires_grad=False)
        self.linear_op = (ops or current_layer_ops()).linear

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear_op(hidden.to(self.weight.dtype), self.weight, None)


class FusedMoE(nn.Module):
    """Stacked expert weights of one layer and their loader (no reduction)."""

    def __init__(
        self, moe: MoEConfig, hidden_size: int, dtype: torch.dtype, expert_parallel: bool, prefix: str = "",
        activation: str = "silu", ops: LayerOps | None = None,
    ):
        super().__init__()
        tp = get_tp_group()
        self.prefix, self.hidden_size = prefix, hidden_size
        # num_experts and num_experts_per_tok (ints) mark this module as routed
        # experts for weight accounting: a token reads top-k of them.
        self.num_experts, self.num_experts_per_tok = moe.num_experts, moe.top_k
        self.intermediate_size = moe.intermediate_size
        if expert_parallel:
            if moe.num_experts % tp.world_size:
                raise ModelLoadError(f"{prefix}: {moe.num_experts} experts do not split over {tp.world_size} ranks")
            self.num_local_experts = moe.num_experts // tp.world_size
            self.first_expert, self.tp_rank, self.tp_size = tp.rank * self.num_local_experts, 0, 1
        else:
            if moe.intermediate_size % tp.world_size:
                raise ModelLoadError(
                    f"{prefix}: expert size {moe.intermediate_size} does not split over {tp.world_size} ranks"
                )
            self.num_local_experts, self.first_expert = moe.num_experts, 0
            self.tp_rank, self.tp_size = tp.rank, tp.world_size
        inter = moe.intermediate_size // self.tp_size
        self.local_intermediate_size = inter
        self.w13_weight = nn.Parameter(torch.empty(self.num_local_experts, 2 * inter, hidden_size, dtype=dtype), requires_grad=False)
        self.w2_weight = nn.Parameter(torch.empty(self.num_local_experts, hidden_size, inter, dtype=dtype), requires_grad=False)
        for param in (self.w13_weight, self.w2_weight):
            param.weight_loader = self.weight_loader
            param.required_shard_ids = self.required_shard_ids
            param.shards_loaded_by = self.shards_loaded_by
        self.activation = _EXPERT_ACTIVATIONS[activation]
        self.experts_op = (ops or current_layer_ops()).fused_moe

    def required_shard_ids(self, param: torch.Tensor) -> list[object]:
        """Shard ids that must be loaded for ``param`` (this rank's experts)."""
        experts = range(self.first_expert, self.first_expert + self.num_local_experts)
        if param is self.w2_weight:
            return [(e, "down") for e in experts]
        return [(e, s) for e in experts for s in (0, 1)]

    def shards_loaded_by(self, param: torch.Tensor, shard_id) -> list[object]:
        """The shards one checkpoint tensor fills: a stacked one, all of this rank's."""
        return self.required_shard_ids(param) if shard_id[0] == "all" else [shard_id]

    def owns(self, shard_id) -> bool:
        expert = shard_id[0]
        return expert == "all" or self.first_expert <= expert < self.first_expert + self.num_local_experts

    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor, shard_id) -> None:
        expert, part = shard_id
        if not self.owns(shard_id):
            return  # another expert-parallel rank's expert
        if expert == "all":  # stacked [E, ...]: load each of this rank's experts
            if loaded.shape[0] != self.num_experts:
                raise ModelLoadError(f"{self.prefix}: stacked experts tensor has {loaded.shape[0]} experts, expected {self.num_experts}")
            for e in range(self.first_expert, self.first_expert + self.num_local_experts):
                if part == "down":
                    self._load_one(param, loaded[e], (e, "down"))
                else:
                    gate, up = loaded[e].chunk(2, dim=0)
                    self._load_one(param, gate, (e, 0))
                    self._load_one(param, up, (e, 1))
            return
        self._load_one(param, loaded, shard_id)

    def _load_one(self, param: torch.Tensor, loaded: torch.Tensor, shard_id) -> None:
        expert, part = shard_id
        inter, size = self.intermediate_size, self.local_intermediate_size
        full = (self.hidden_size, inter) if part == "down" else (inter, self.hidden_size)
        if tuple(loaded.shape) != full:
            raise ModelLoadError(f"{self.prefix}: expert {expert} tensor has shape {tuple(loaded.shape)}, expected {full}")
        local = expert - self.first_expert
        if part == "down":
            param.data[local].copy_(loaded.narrow(1, self.tp_rank * size, size))
        else:
            param.data[local, part * size : (part + 1) * size].copy_(loaded.narrow(0, self.tp_rank * size, size))

    def local_ids(self, topk_ids: torch.Tensor) -> torch.Tensor:
        """Global expert ids -> this rank's indices, -1 for experts held elsewhere."""
        if self.num_local_experts == self.num_experts:
            return topk_ids
        local = topk_ids - self.first_expert
        return torch.where((local >= 0) & (local < self.num_local_experts), local, -1)

    def forward(self, hidden: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        ids = self.local_ids(topk_ids)
        return self.experts_op(hidden, self.w13_weight, self.w2_weight, topk_weights, ids, self.activation)


class SparseMoeBlock(nn.Module):
    """Router + experts (+ a sigmoid-gated shared expert), summed over the TP group."""

    def __init__(self, ctx, prefix: str, shared_expert: nn.Module | None = None) -> None:
        super().__init__()
        config, moe = ctx.config, ctx.config.moe
        self.moe, self.top_k, self.renormalize = moe, moe.top_k, moe.renormalize
        # The router stays unquantized in every format (its logits pick
        # experts); DeepSeek computes it in float32.
        router_dtype = torch.float32 if config.model_type.startswith("deepseek") else ctx.dtype
        self.gate = Router(moe, config.hidden_size, router_dtype, ctx.ops)
        self.experts = FusedMoE(
            moe, config.hidden_size, ctx.dtype, ctx.expert_parallel, f"{prefix}.experts", config.hidden_act, ctx.ops
        )
        self.shared_expert = shared_expert
        self.shared_expert_gate = None
        if shared_expert is not None and moe.shared_expert_gate:
            self.shared_expert_gate = ReplicatedLinear(
                config.hidden_size, 1, bias=False, prefix=f"{prefix}.shared_expert_gate", params_dtype=ctx.dtype
            )
        self.tp_size = get_tp_group().world_size
        self.router_op = ctx.ops.moe_topk_softmax  # plain routing (see moe_config)
        # Plain routing over every expert (no expert parallelism: no ids to
        # map to this rank's): the router's top-k and the experts as one op,
        # which may pick the experts inside its kernels (kernels/moe_routed.py).
        holds_all = self.experts.num_local_experts == self.experts.num_experts
        self.routed_experts_op = ctx.ops.fused_moe_routed if moe.plain_routing and holds_all else None
        # Plain routing by a router in the model's dtype: the layer's norm,
        # the router and the top-k may be one op (``RMSNorm.add_then_route``,
        # then ``after_route``).
        self.routes_after_norm = moe.plain_routing and router_dtype == ctx.dtype

    def route(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.gate(hidden)
        if self.moe.plain_routing:
            return self.router_op(logits, self.top_k, self.renormalize)
        return grouped_select_experts(logits, self.gate.e_score_correction_bias, self.moe)

    def routed_experts(self, hidden: torch.Tensor) -> torch.Tensor:
        """The experts' weighted sum for ``hidden``, the router included."""
        if self.routed_experts_op is not None:
            experts = self.experts
            return self.routed_experts_op(
                hidden, experts.w13_weight, experts.w2_weight, self.gate(hidden), self.top_k, self.renormalize,
                experts.activation,
            )
        weights, ids = self.route(hidden)
        return self.experts(hidden, weights, ids)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.after_route(hidden)

    def after_route(
        self, hidden: torch.Tensor, topk_weights: torch.Tensor | None = None, topk_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The block for ``hidden`` (normed) whose routing is done when
        ``topk_weights`` / ``topk_ids`` are given (global expert ids)."""
        if topk_ids is None:
            out = self.routed_experts(hidden)
        else:
            out = self.experts(hidden, topk_weights, topk_ids)
        if self.shared_expert is not None:
            shared = self.shared_expert(hidden)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(hidden)) * shared
            out = out + shared
        return tensor_model_parallel_all_reduce(out) if self.tp_size > 1 else out
