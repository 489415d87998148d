"""Multi-token prediction (MTP) heads as drafts: the extra layer DeepSeek V3
and GLM-4.5 / 4.6 checkpoints carry (``num_nextn_predict_layers``), stored
as layer ``num_hidden_layers`` of the target's own checkpoint.

At position ``p`` the head reads the embedding of token ``x[p+1]`` and the
target's final hidden state of position ``p`` (after its last norm), and
predicts ``x[p+2]``:

    x = eh_proj([enorm(embed(x[p+1])), hnorm(hidden)])   (the embedding is 0 at position 0)
    stream = x + one decoder layer of the target's family (its attention and MoE)
    logits = shared_head.head(shared_head.norm(stream))

Each further guess reads the head's own ``stream`` at the position before,
as an EAGLE head does: ``runtime/eagle_proposer.py`` runs both. The
embedding (and the LM head, where the checkpoint has no ``shared_head.head``)
are the target's; the target's final norm turns the stream the target's
forward keeps (``models/aux_hidden.py``) into the hidden state read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from types import SimpleNamespace

import torch
from torch import nn

from octavo.errors import ModelLoadError, UnsupportedModelError
from octavo.models.base import ModelInitContext
from octavo.models.layers.attention import ForwardContext
from octavo.models.layers.embedding import ParallelLMHead
from octavo.models.layers.linear import ReplicatedLinear
from octavo.models.llama import LAYER_KINDS, LlamaForCausalLM
from octavo.models.registry import resolve_model_class
from octavo.models.weight_loading import check_all_loaded, load_named_tensors
from octavo.models.weights import param_name

# The families whose checkpoints carry MTP layers of this shape.
ARCHITECTURES = ("DeepseekV3ForCausalLM", "Glm4MoeForCausalLM")
_BLOCK_PARTS = ("self_attn.", "mlp.", "input_layernorm.", "post_attention_layernorm.")


class MtpHead(nn.Module):
    def __init__(self, ctx: ModelInitContext) -> None:
        super().__init__()
        config = self.config = ctx.config
        if config.architecture not in ARCHITECTURES:
            raise UnsupportedModelError(
                f"multi-token prediction drafts {', '.join(ARCHITECTURES)} checkpoints, not {config.architecture}"
            )
        if int(config.raw.get("num_nextn_predict_layers") or 0) < 1:
            raise ModelLoadError("the checkpoint has no multi-token-prediction layer (num_nextn_predict_layers is 0)")
        family = resolve_model_class(config.architecture)
        if not issubclass(family, LlamaForCausalLM):
            raise UnsupportedModelError(f"{config.architecture} has no decoder layer an MTP head can use")
        self.family, self.layer = family, config.num_hidden_layers
        self.target_hidden_size, self.aux_layer_ids = config.hidden_size, (config.num_hidden_layers,)
        options = family.decoder_options(config, ctx.dtype)
        hidden, prefix = config.hidden_size, f"model.layers.{self.layer}"
        self.enorm, self.hnorm = options.norm(ctx, hidden), options.norm(ctx, hidden)
        self.eh_proj = ReplicatedLinear(2 * hidden, hidden, bias=False, prefix=f"{prefix}.eh_proj", params_dtype=ctx.dtype)
        # Its MLP is the family's sparse one (built as any sparse layer's), its attention layer 0's.
        moe = config.moe
        sparse = next((i for i, s in enumerate(moe.sparse_layers) if s), 0) if moe is not None else 0
        mlp = family.build_mlp(None, ctx, sparse, f"{prefix}.mlp")
        self.block = LAYER_KINDS[options.layer_kind](ctx, options, mlp, 0, prefix)
        self.shared_head = nn.Module()
        self.shared_head.norm = options.norm(ctx, hidden)
        self.shared_head.head = ParallelLMHead(config.vocab_size, hidden, ctx.dtype, f"{prefix}.shared_head.head")
        self.embed_tokens: nn.Module | None = None  # the target's (``share_target_layers``)
        self.target_norm: nn.Module | None = None

    def share_target_layers(self, embed_tokens: nn.Module, lm_head: nn.Module | None, final_norm: nn.Module | None = None) -> None:
        self.embed_tokens, self.target_norm = embed_tokens, final_norm
        if self.shared_head.head is None:
            if lm_head is None:
                raise ModelLoadError("the MTP layer has no shared_head.head and the target's LM head is not on this rank")
            self.shared_head.head = lm_head

    def combine(self, stream: torch.Tensor) -> torch.Tensor:
        """The target's stream after its last layer as the hidden state the head reads (its final norm applied)."""
        return self.target_norm(stream)

    def forward(self, input_ids, positions, hidden, fctx: ForwardContext) -> tuple[torch.Tensor, torch.Tensor]:
        embeds = self.embed_tokens(input_ids).masked_fill((positions == 0)[:, None], 0.0)
        x = self.eh_proj(torch.cat([self.enorm(embeds), self.hnorm(hidden)], dim=-1))
        delta, residual = self.block(positions, x, None, fctx)
        stream = delta + residual
        return self.shared_head.norm(stream), stream

    def greedy(self, normed: torch.Tensor) -> torch.Tensor:
        return self.shared_head.head.compute_logits(normed).argmax(dim=-1)

    # ------------------------------------------------------------- weights

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        prefix, renames = f"model.layers.{self.layer}.", self.family.checkpoint_renames

        def rename(name: str):
            if not name.startswith(prefix):
                return None  # the target's own layers
            name = name[len(prefix):]
            if name.startswith("embed_tokens."):
                return None  # the target's embedding, shared
            if name.startswith(_BLOCK_PARTS):
                name = "block." + name
            return param_name(name, renames)

        loaded = load_named_tensors(self, self._family_order(weights), rename)
        if not loaded:
            raise ModelLoadError(f"the checkpoint holds no tensors of its MTP layer ({prefix}*)")
        has_head = "shared_head.head.weight" in loaded
        check_all_loaded(self, loaded, {"qkv_proj": ("q", "k", "v"), "gate_up_proj": (0, 1)},
                         skip=lambda name: name == "shared_head.head.weight" and not has_head)
        if not has_head:
            self.shared_head.head = None
        return loaded

    def _family_order(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """The family's own reordering of rows as it loads them (DeepSeek's interleaved rotary rows)."""
        deinterleave = getattr(self.family, "_deinterleave", None)
        shim = SimpleNamespace(config=self.config)
        if deinterleave is not None and self.family.uses_interleaved_rope(shim):
            return deinterleave(shim, weights)
        return iter(weights)


def checkpoint_has_mtp_layer(model_dir, num_hidden_layers: int) -> bool:
    """Whether the checkpoint's safetensors hold tensors of layer ``num_hidden_layers`` (read from the headers)."""
    from safetensors import safe_open

    from octavo.models.loader import safetensors_files

    prefix = f"model.layers.{num_hidden_layers}."
    for file in safetensors_files(model_dir):
        with safe_open(str(file), framework="pt") as f:
            if any(name.startswith(prefix) for name in f.keys()):
                return True
    return False
