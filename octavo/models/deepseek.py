"""DeepSeek V2 and V3: multi-head latent attention (MLA) and DeepSeek's MoE.

MLA compresses each token's keys and values into one latent vector
``c_kv`` (``kv_lora_rank`` wide, RMS-normalised) plus a small shared rotary
key ``k_pe``; every head's key and value are ``W_UK c_kv`` and ``W_UV c_kv``
(``kv_b_proj``). The cache holds only the latent: one "KV head" per token of
``kv_lora_rank + qk_rope_head_dim`` values (the key ``[c_kv, k_pe]``, the
value ``[c_kv, 0]``), so any paged backend runs it as multi-query attention.
The up-projections are absorbed instead (``q_nope W_UK`` before attention,
``W_UV`` after), which is exact: ``q_nope . W_UK c_kv = (W_UK^T q_nope) .
c_kv``. Per token and layer the cache stores ``2 x (kv_lora_rank + rope)``
values instead of ``2 x heads x head_dim`` (DeepSeek-V2-Lite: 1,152 against
6,144). The softmax scale folds in YaRN's ``mscale_all_dim`` as DeepSeek does.

DeepSeek rotates interleaved pairs of the rotary dimensions; the rows that
produce them (in ``q_proj`` / ``q_b_proj`` and ``kv_a_proj_with_mqa``) are
de-interleaved when loaded, after which the usual rotate-half rotation gives
the same dot products.

MoE (``moe_config.py``): routed experts plus always-on shared experts (no
gate), the first ``first_k_dense_replace`` layers dense; V2 routes by
softmax (optionally within the best expert groups), V3 by sigmoid with a
correction bias and grouped top-k. Routed weights are scaled by
``routed_scaling_factor``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from octavo.core.attention import AttentionSpec
from octavo.lora.layer import lora_build_scope
from octavo.models.base import ModelInitContext
from octavo.models.layers.attention import Attention, ForwardContext
from octavo.models.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from octavo.models.layers.norm import RMSNorm
from octavo.models.layers.rotary import RotaryEmbedding, yarn_mscale
from octavo.models.llama import DecoderOptions
from octavo.models.moe_decoder import MoEForCausalLM


def mla_softmax_scale(qk_head_dim: int, rope_params: dict | None) -> float:
    scale = qk_head_dim**-0.5
    params = rope_params or {}
    if params.get("rope_type", "default") != "default" and params.get("mscale_all_dim"):
        mscale = yarn_mscale(params["factor"], params["mscale_all_dim"])
        scale *= mscale * mscale
    return scale


class MLAttention(nn.Module):
    def __init__(self, ctx: ModelInitContext, options: DecoderOptions, layer_index: int, prefix: str):
        super().__init__()
        config, raw = ctx.config, ctx.config.raw
        hidden, heads, quant, dtype = config.hidden_size, config.num_attention_heads, ctx.quant_config, ctx.dtype
        self.nope, self.rope, self.v_dim = int(raw["qk_nope_head_dim"]), int(raw["qk_rope_head_dim"]), int(raw["v_head_dim"])
        self.kv_lora, q_lora = int(raw["kv_lora_rank"]), raw.get("q_lora_rank")
        qk, bias = self.nope + self.rope, config.attention_bias

        def column(name, inputs, outputs, quant_config=quant):
            return ColumnParallelLinear(inputs, [outputs], bias=False, quant_config=quant_config, prefix=f"{prefix}.{name}", params_dtype=dtype)

        self.q_proj = self.q_a_proj = self.q_a_layernorm = self.q_b_proj = None
        if q_lora:
            self.q_a_proj = ReplicatedLinear(hidden, int(q_lora), bias, quant, f"{prefix}.q_a_proj", dtype)
            self.q_a_layernorm = RMSNorm(int(q_lora), config.rms_norm_eps, dtype)
            self.q_b_proj = column("q_b_proj", int(q_lora), heads * qk)
        else:
            self.q_proj = column("q_proj", hidden, heads * qk)
        self.kv_a_proj_with_mqa = ReplicatedLinear(hidden, self.kv_lora + self.rope, bias, quant, f"{prefix}.kv_a_proj_with_mqa", dtype)
        self.kv_a_layernorm = RMSNorm(self.kv_lora, config.rms_norm_eps, dtype)
        # Used as a matrix (absorbed into q and the output): never quantized,
        # and never given LoRA (its updates would need the product it skips).
        with lora_build_scope(None):
            self.kv_b_proj = column("kv_b_proj", self.kv_lora, heads * (self.nope + self.v_dim), quant_config=None)
        self.o_proj = RowParallelLinear(heads * self.v_dim, hidden, bias, quant, f"{prefix}.o_proj", dtype)
        self.num_heads = self.kv_b_proj.shard_sizes[0] // (self.nope + self.v_dim)
        self.rotary_emb = RotaryEmbedding(self.rope, ctx.max_model_len, config.rope_theta, config.rope_parameters)
        spec = AttentionSpec(
            num_heads=self.num_heads, num_kv_heads=1, head_size=self.kv_lora + self.rope,
            scale=mla_softmax_scale(qk, config.rope_parameters), dtype=dtype, kv_cache_dtype=ctx.kv_cache_dtype,
            block_size=ctx.block_size, sliding_window=config.sliding_windows[layer_index],
        )
        self.attn = Attention(ctx.attention_backend(spec), layer_index)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, fctx: ForwardContext) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        q = self.q_proj(hidden) if self.q_proj is not None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden)))
        q_nope, q_pe = q.view(num_tokens, self.num_heads, -1).split([self.nope, self.rope], dim=-1)
        c_kv, k_pe = self.kv_a_proj_with_mqa(hidden).split([self.kv_lora, self.rope], dim=-1)
        c_kv = self.kv_a_layernorm(c_kv.contiguous())
        q_pe, k_pe = self.rotary_emb(positions, q_pe.contiguous(), k_pe.reshape(num_tokens, 1, self.rope).contiguous())
        w_kv = self.kv_b_proj.weight.view(self.num_heads, self.nope + self.v_dim, self.kv_lora)
        query = torch.cat([torch.einsum("thn,hnl->thl", q_nope, w_kv[:, : self.nope]), q_pe], dim=-1)
        key = torch.cat([c_kv, k_pe.reshape(num_tokens, self.rope)], dim=-1).unsqueeze(1)
        value = F.pad(c_kv, (0, self.rope)).unsqueeze(1)
        latent = self.attn(query, key, value, fctx).view(num_tokens, self.num_heads, -1)[..., : self.kv_lora]
        out = torch.einsum("thl,hvl->thv", latent, w_kv[:, self.nope :])
        return self.o_proj(out.reshape(num_tokens, self.num_heads * self.v_dim))


def deinterleave_rows(tensor: torch.Tensor, start: int, size: int, period: int) -> torch.Tensor:
    """Rows ``[start, start + size)`` of every ``period`` rows reordered
    even-then-odd (interleaved rotary pairs -> rotate-half layout)."""
    order = torch.cat([torch.arange(0, size, 2), torch.arange(1, size, 2)])
    rows = torch.arange(tensor.shape[0])
    for base in range(0, tensor.shape[0], period):
        rows[base + start : base + start + size] = base + start + order
    return tensor[rows]


class DeepseekV2ForCausalLM(MoEForCausalLM):
    checkpoint_renames = ((".shared_experts.", ".shared_expert."),)
    interleaved_rope = True
    # The loader reorders the rope rows of q and kv_a (and kv_b is used as a
    # matrix): an adapter's B rows would not line up with them.
    supports_lora = False

    @classmethod
    def decoder_options(cls, config, dtype) -> DecoderOptions:
        return DecoderOptions(attention=MLAttention)

    def _deinterleave(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        raw = self.config.raw
        nope, rope, kv_lora = int(raw["qk_nope_head_dim"]), int(raw["qk_rope_head_dim"]), int(raw["kv_lora_rank"])
        for name, tensor in weights:
            if name.endswith(("self_attn.q_proj.weight", "self_attn.q_b_proj.weight")):
                tensor = deinterleave_rows(tensor, nope, rope, nope + rope)
            elif ".self_attn.kv_a_proj_with_mqa." in name:
                tensor = deinterleave_rows(tensor, kv_lora, rope, kv_lora + rope)
            yield name, tensor

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights(self._deinterleave(weights) if self.uses_interleaved_rope() else weights)

    def uses_interleaved_rope(self) -> bool:
        return self.interleaved_rope


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    def uses_interleaved_rope(self) -> bool:
        return bool(self.config.raw.get("rope_interleave", True))
