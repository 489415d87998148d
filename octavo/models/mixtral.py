"""Mixtral: the Llama decoder with 8 SwiGLU experts per layer, top-2 routing
(weights renormalised). Checkpoints call the MoE block ``block_sparse_moe``
and the experts' projections ``w1`` (gate), ``w3`` (up), ``w2`` (down)."""

from octavo.models.moe_decoder import MoEForCausalLM


class MixtralForCausalLM(MoEForCausalLM):
    checkpoint_renames = ((".block_sparse_moe.", ".mlp."),)
