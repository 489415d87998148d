"""Granite 3.x MoE (``GraniteMoeForCausalLM``) and its variant with a
shared MLP (``GraniteMoeSharedForCausalLM``).

Granite's decoder (its four multipliers: ``granite.py``) with a mixture of
SwiGLU experts in every layer. The router keeps the top ``k`` logits and
takes their softmax, which is the softmax over all experts renormalised
over the top ``k`` (plain routing with ``renormalize``: ``moe_config.py``).
Checkpoints store every layer's experts fused: ``input_linear.weight``
``[experts, 2 * intermediate, hidden]`` (gate rows, then up rows) and
``output_linear.weight`` ``[experts, hidden, intermediate]``, the stacked
layout the MoE layer holds; the router is ``router.layer.weight``
(transformers 5 may save ``experts.gate_up_proj``, ``experts.down_proj``
and ``router.weight`` instead: both load). The shared variant adds a dense
SwiGLU MLP every token goes through (``shared_mlp``, width
``shared_intermediate_size``; its ``input_linear`` is gate and up fused),
summed with the experts' output before the residual multiplier.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from octavo.models.granite import GraniteForCausalLM
from octavo.models.moe_decoder import MoEForCausalLM

_SHARED_INPUT = ".shared_mlp.input_linear.weight"


class GraniteMoeForCausalLM(MoEForCausalLM, GraniteForCausalLM):
    # Applied in order: the experts' and router's own names first, then the block's.
    checkpoint_renames = (
        (".block_sparse_moe.input_linear.weight", ".mlp.experts.gate_up_proj"),
        (".block_sparse_moe.output_linear.weight", ".mlp.experts.down_proj"),
        (".block_sparse_moe.router.layer.", ".mlp.gate."),
        (".block_sparse_moe.router.", ".mlp.gate."),
        (".block_sparse_moe.", ".mlp."),
        (".shared_mlp.output_linear.", ".mlp.shared_expert.down_proj."),
    )


class GraniteMoeSharedForCausalLM(GraniteMoeForCausalLM):
    @staticmethod
    def _split_shared(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """The shared MLP's fused gate-up rows as the gate and up projections the MLP loads."""
        for name, tensor in weights:
            if name.endswith(_SHARED_INPUT):
                prefix = name.removesuffix(_SHARED_INPUT) + ".mlp.shared_expert."
                gate, up = tensor.chunk(2, dim=0)
                yield from ((f"{prefix}gate_proj.weight", gate), (f"{prefix}up_proj.weight", up))
            else:
                yield name, tensor

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights(self._split_shared(weights))
