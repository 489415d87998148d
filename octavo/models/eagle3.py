"""EAGLE-3 draft heads for Llama-shaped targets (speculative decoding).

An EAGLE-3 head is one (rarely more) decoder layer trained to guess the
target's next tokens from the target's own hidden states. At position ``p``
it reads the embedding of token ``x[p+1]`` and a hidden state of position
``p``, and predicts ``x[p+2]``:

- the first guess of a step reads the target's hidden states: the residual
  stream entering three of its layers (``eagle_aux_hidden_state_layer_ids``,
  by default 2, L/2 and L-3), concatenated and projected by ``fc`` from
  3 x the target's width to the head's;
- each further guess reads the head's own output stream (before its final
  norm) at the position before.

The first layer's attention reads ``[norm(embedding), hidden_norm(hidden)]``
(twice the width, its q/k/v projections say so); its residual is the hidden
state, normed or not (``norm_before_residual``). The head's vocabulary may
be a subset of the target's (``draft_vocab_size``): guess ``i`` of the head
is target token ``i + d2t[i]``.

Two checkpoint layouts load: EAGLE's own (``LlamaForCausalLMEagle3``,
layer weights under ``midlayer.``) and the ``speculators`` library's
(``speculators_model_type: "eagle3"``, the layer's config under
``transformer_layer_config``; ``models/config.py`` flattens it). Heads
without ``embed_tokens`` use the target's embedding, and without an
``lm_head`` (full vocabulary only) the target's LM head
(``runtime/eagle_proposer.py`` hands them over).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from octavo.errors import ModelLoadError
from octavo.models.base import ModelInitContext
from octavo.models.layers.attention import ForwardContext
from octavo.models.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from octavo.models.layers.linear import QKVParallelLinear, ReplicatedLinear
from octavo.models.layers.mlp import DecoderMLP
from octavo.models.layers.norm import RMSNorm
from octavo.models.llama import DecoderAttention, DecoderOptions
from octavo.models.weights import param_name
from octavo.models.weight_loading import check_all_loaded, load_named_tensors

ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")


class Eagle3Layer(nn.Module):
    def __init__(self, ctx: ModelInitContext, layer_index: int, norm_before_residual: bool) -> None:
        super().__init__()
        config, prefix = ctx.config, f"layers.{layer_index}"
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.first = layer_index == 0
        self.norm_before_residual = norm_before_residual
        self.self_attn = DecoderAttention(ctx, DecoderOptions(), layer_index, f"{prefix}.self_attn")
        if self.first:  # q/k/v read the embedding and the hidden state side by side
            attn = self.self_attn
            self.self_attn.qkv_proj = QKVParallelLinear(
                2 * hidden, attn.head_size, config.num_attention_heads, config.num_key_value_heads,
                bias=config.attention_bias, quant_config=None, prefix=f"{prefix}.self_attn.qkv_proj",
                params_dtype=ctx.dtype,
            )
            self.hidden_norm = RMSNorm(hidden, eps, ctx.dtype)
        self.mlp = DecoderMLP(ctx, f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(hidden, eps, ctx.dtype)
        self.post_attention_layernorm = RMSNorm(hidden, eps, ctx.dtype)

    def forward(self, positions, embeds, hidden, residual, fctx: ForwardContext):
        if self.first:
            if self.norm_before_residual:
                hidden = residual = self.hidden_norm(hidden)
            else:
                hidden, residual = self.hidden_norm(hidden), hidden
            hidden = torch.cat([self.input_layernorm(embeds), hidden], dim=-1)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, fctx)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class Eagle3LlamaForCausalLM(nn.Module):
    """The head. ``forward`` returns ``(normed, stream)``: the final norm's
    output (for ``greedy``) and the stream before it (the next guess's hidden)."""

    def __init__(self, ctx: ModelInitContext) -> None:
        super().__init__()
        config = ctx.config
        self.config = config
        raw = config.raw
        hidden = config.hidden_size
        eagle_config = raw.get("eagle_config") or {}
        if eagle_config.get("use_aux_hidden_state", True) is not True:
            raise ModelLoadError("EAGLE-3 heads without auxiliary hidden states (use_aux_hidden_state false) are not supported")
        self.target_hidden_size = int(raw.get("target_hidden_size") or hidden)
        self.draft_vocab_size = int(raw.get("draft_vocab_size") or config.vocab_size)
        layer_ids = raw.get("eagle_aux_hidden_state_layer_ids") or eagle_config.get("eagle_aux_hidden_state_layer_ids")
        self.aux_layer_ids: tuple[int, ...] | None = tuple(int(i) for i in layer_ids) if layer_ids else None
        if self.aux_layer_ids is not None and len(self.aux_layer_ids) != 3:
            raise ModelLoadError(f"eagle_aux_hidden_state_layer_ids must name 3 layers, got {list(self.aux_layer_ids)}")
        norm_before_residual = bool(raw.get("norm_before_residual", False))
        self.embed_tokens: VocabParallelEmbedding | None = VocabParallelEmbedding(
            config.vocab_size, hidden, ctx.dtype, "embed_tokens"
        )
        self.fc = ReplicatedLinear(3 * self.target_hidden_size, hidden, bias=False, prefix="fc", params_dtype=ctx.dtype)
        self.layers = nn.ModuleList(
            [Eagle3Layer(ctx, i, norm_before_residual) for i in range(config.num_hidden_layers)]
        )
        self.norm = RMSNorm(hidden, config.rms_norm_eps, ctx.dtype)
        self.lm_head: ParallelLMHead | None = ParallelLMHead(self.draft_vocab_size, hidden, ctx.dtype, "lm_head")
        # Head token i is target token i + d2t[i] (zeros: the same vocabulary).
        self.d2t = nn.Parameter(torch.zeros(self.draft_vocab_size, dtype=torch.long), requires_grad=False)
        self.d2t.weight_loader = self._load_d2t

    def combine(self, aux_hidden: torch.Tensor) -> torch.Tensor:
        """The target's three hidden states of each position, side by side, as the head's hidden state."""
        return self.fc(aux_hidden)

    def forward(self, input_ids, positions, hidden, fctx: ForwardContext) -> tuple[torch.Tensor, torch.Tensor]:
        embeds = self.embed_tokens(input_ids)
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, embeds, hidden, residual, fctx)
        return self.norm(hidden, residual)

    def greedy(self, normed: torch.Tensor) -> torch.Tensor:
        """The head's most likely next token at each row, as a target token id."""
        guesses = self.lm_head.compute_logits(normed).argmax(dim=-1)
        return guesses + self.d2t[guesses]

    # ------------------------------------------------------------- weights

    def _load_d2t(self, param: torch.Tensor, loaded: torch.Tensor, shard_id=None) -> None:
        if loaded.shape != param.shape:
            raise ModelLoadError(f"d2t: checkpoint tensor has shape {tuple(loaded.shape)}, expected {tuple(param.shape)}")
        targets = torch.arange(loaded.shape[0]) + loaded.to(torch.long).cpu()
        if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= self.config.vocab_size):
            raise ModelLoadError(f"d2t maps head tokens outside the target's vocabulary of {self.config.vocab_size}")
        param.data.copy_(loaded.to(torch.long))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        def rename(name: str):
            name = name.removeprefix("model.").replace("midlayer.", "layers.0.")
            if name == "t2d" or "rotary_emb.inv_freq" in name:
                return None  # t2d is d2t's inverse, as a mask
            return param_name(name)

        loaded = load_named_tensors(self, weights, rename)
        # Absent embeddings (and, at full vocabulary, an absent LM head) are the target's.
        shared = {"embed_tokens.weight"} - loaded
        if self.draft_vocab_size == self.config.vocab_size:
            shared |= {"lm_head.weight"} - loaded
        check_all_loaded(
            self, loaded, {"qkv_proj": ("q", "k", "v"), "gate_up_proj": (0, 1)},
            skip=lambda name: name in shared or name == "d2t",
        )
        if "embed_tokens.weight" in shared:
            self.embed_tokens = None
        if "lm_head.weight" in shared:
            self.lm_head = None
        return loaded

    def share_target_layers(self, embed_tokens: nn.Module, lm_head: nn.Module | None, final_norm=None) -> None:
        """Use the target's embedding (and LM head) where the checkpoint has none."""
        if self.embed_tokens is None:
            self.embed_tokens = embed_tokens
        if self.lm_head is None:
            if lm_head is None:
                raise ModelLoadError("the EAGLE-3 head has no lm_head and the target's is not on this rank")
            self.lm_head = lm_head
