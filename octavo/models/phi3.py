"""Phi-3: the Llama decoder, with q/k/v and gate/up already fused in the
checkpoint (``qkv_proj``, ``gate_up_proj``) and LongRoPE scaling
(``models/layers/rotary.py``). The fused tensors are split into their parts
on the way in, so that tensor parallelism slices each part as usual."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from octavo.models.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    def _split_fused(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        config = self.config
        q_size = config.num_attention_heads * config.head_dim
        kv_size = config.num_key_value_heads * config.head_dim
        for name, tensor in weights:
            if name.endswith(".self_attn.qkv_proj.weight"):
                q, k, v = tensor.split([q_size, kv_size, kv_size], dim=0)
                prefix = name.removesuffix("qkv_proj.weight")
                yield from ((f"{prefix}q_proj.weight", q), (f"{prefix}k_proj.weight", k), (f"{prefix}v_proj.weight", v))
            elif name.endswith(".mlp.gate_up_proj.weight"):
                gate, up = tensor.chunk(2, dim=0)
                prefix = name.removesuffix("gate_up_proj.weight")
                yield from ((f"{prefix}gate_proj.weight", gate), (f"{prefix}up_proj.weight", up))
            else:
                yield name, tensor

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights(self._split_fused(weights))
