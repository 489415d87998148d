"""EAGLE (EAGLE-1, and HASS's variant) draft heads for Llama-shaped targets.

At position ``p`` the head reads the embedding of token ``x[p+1]`` and the
target's final hidden state of position ``p`` (after its last norm), and
predicts ``x[p+2]``:

    x = fc([embed(x[p+1]), hidden])       (HASS, ``add_para_norm``: each normed first)
    stream = Llama decoder layers over x  (the first without its input norm)
    logits = the target's LM head over the stream (no norm between)

Each further guess reads the head's own ``stream`` at the position before,
as EAGLE-3 heads and MTP layers do (``runtime/eagle_proposer.py`` runs all
three). EAGLE's own layout loads (``fc``, ``layers.N.``; ``fc.bias`` where
the head has one); a head without ``embed_tokens`` uses the target's.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from octavo.models.base import ModelInitContext
from octavo.models.layers.attention import ForwardContext
from octavo.models.layers.embedding import VocabParallelEmbedding
from octavo.models.layers.linear import ReplicatedLinear
from octavo.models.layers.mlp import DecoderMLP
from octavo.models.layers.norm import RMSNorm
from octavo.models.llama import DecoderLayer, DecoderOptions
from octavo.models.weight_loading import check_all_loaded, load_named_tensors
from octavo.models.weights import param_name


class EagleLlamaForCausalLM(nn.Module):
    reads_final_hidden = True  # the proposer keeps the stream after the target's last layer for it

    def __init__(self, ctx: ModelInitContext) -> None:
        super().__init__()
        config = self.config = ctx.config
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.target_hidden_size, self.aux_layer_ids = hidden, None
        self.para_norms = bool(config.raw.get("add_para_norm"))
        if self.para_norms:
            self.embedding_layernorm = RMSNorm(hidden, eps, ctx.dtype)
            self.hidden_states_layernorm = RMSNorm(hidden, eps, ctx.dtype)
        self.embed_tokens: VocabParallelEmbedding | None = VocabParallelEmbedding(config.vocab_size, hidden, ctx.dtype, "embed_tokens")
        # A bias where the checkpoint has one (EAGLE's own heads do); zeros otherwise.
        self.fc = ReplicatedLinear(2 * hidden, hidden, bias=True, prefix="fc", params_dtype=ctx.dtype)
        options = DecoderOptions(qkv_bias=config.attention_bias, o_bias=config.attention_bias)
        self.layers = nn.ModuleList(
            [DecoderLayer(ctx, options, DecoderMLP(ctx, f"layers.{i}.mlp"), i, f"layers.{i}") for i in range(config.num_hidden_layers)]
        )
        self.layers[0].input_layernorm = nn.Identity()  # EAGLE's first layer reads fc's output as it is
        self.lm_head: nn.Module | None = None
        self.target_norm: nn.Module | None = None

    def share_target_layers(self, embed_tokens: nn.Module, lm_head: nn.Module | None, final_norm: nn.Module | None = None) -> None:
        if self.embed_tokens is None:
            self.embed_tokens = embed_tokens
        self.lm_head, self.target_norm = lm_head, final_norm

    def combine(self, stream: torch.Tensor) -> torch.Tensor:
        """The target's stream after its last layer, through its final norm: the hidden state EAGLE reads."""
        return self.target_norm(stream)

    def forward(self, input_ids, positions, hidden, fctx: ForwardContext) -> tuple[torch.Tensor, torch.Tensor]:
        embeds = self.embed_tokens(input_ids)
        if self.para_norms:
            embeds, hidden = self.embedding_layernorm(embeds), self.hidden_states_layernorm(hidden)
        x, residual = self.fc(torch.cat([embeds, hidden], dim=-1)), None
        for layer in self.layers:
            x, residual = layer(positions, x, residual, fctx)
        stream = x + residual
        return stream, stream

    def greedy(self, stream: torch.Tensor) -> torch.Tensor:
        return self.lm_head.compute_logits(stream).argmax(dim=-1)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        def rename(name: str):
            name = name.removeprefix("model.")
            if "rotary_emb.inv_freq" in name or name.startswith("lm_head."):
                return None  # EAGLE's heads use the target's LM head
            return param_name(name)

        loaded = load_named_tensors(self, weights, rename)
        optional = {"fc.bias", "embed_tokens.weight"}
        check_all_loaded(self, loaded, {"qkv_proj": ("q", "k", "v"), "gate_up_proj": (0, 1)},
                         skip=lambda name: name in optional)
        if "fc.bias" not in loaded:
            with torch.no_grad():
                self.fc.bias.zero_()
        if "embed_tokens.weight" not in loaded:
            self.embed_tokens = None  # the target's (``share_target_layers``)
        return loaded
