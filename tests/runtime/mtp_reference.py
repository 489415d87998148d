"""A small GLM-4.5 or DeepSeek V3 checkpoint with a multi-token-prediction layer (which
transformers neither builds nor saves: its block is the last layer of a
model one layer deeper, its own tensors random), and a plain-torch
reference of what that layer guesses after a sequence, no KV cache,
transformers' own decoder layer as its block."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from tests.checkpoints import COMMON, FAMILY_OVERRIDES


CLASSES = {"glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM"), "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM")}


def build_with_mtp(out_dir: Path, tokenizer_dir: Path, family: str = "glm4_moe", seed: int = 0):
    """The checkpoint (2 layers + an MTP layer as layer 2) and the 3-layer model whose last layer is its block."""
    import transformers
    from safetensors.torch import save_file
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size()
    torch.manual_seed(seed)
    settings = {**COMMON, "vocab_size": vocab, **FAMILY_OVERRIDES[family][1]}
    config_class, model_class = (getattr(transformers, name) for name in CLASSES[family])
    full = model_class(config_class(**{**settings, "num_hidden_layers": 3}))
    with torch.no_grad():
        for name, param in full.named_parameters():
            if "norm" in name:
                param.normal_(1.0, 0.1)
            else:
                param.normal_(0.0, 0.08)
        for layer in full.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.normal_(0.0, 0.05)
    target = model_class(config_class(**{**settings, "num_hidden_layers": 2, "num_nextn_predict_layers": 1}))
    target.load_state_dict({k: v for k, v in full.state_dict().items() if ".layers.2." not in k})
    target.save_pretrained(str(out_dir))
    hidden = settings["hidden_size"]
    gen = torch.Generator().manual_seed(seed + 1)
    extra = {f"model.layers.2.{k}": v.clone() for k, v in full.model.layers[2].state_dict().items()}
    extra.update({
        "model.layers.2.enorm.weight": 1.0 + 0.1 * torch.randn(hidden, generator=gen),
        "model.layers.2.hnorm.weight": 1.0 + 0.1 * torch.randn(hidden, generator=gen),
        "model.layers.2.eh_proj.weight": 0.08 * torch.randn(hidden, 2 * hidden, generator=gen),
        "model.layers.2.shared_head.norm.weight": 1.0 + 0.1 * torch.randn(hidden, generator=gen),
        "model.layers.2.shared_head.head.weight": 0.08 * torch.randn(vocab, hidden, generator=gen),
        "model.layers.2.embed_tokens.weight": full.model.embed_tokens.weight.detach().clone(),
    })
    save_file({k: v.contiguous() for k, v in extra.items()}, str(out_dir / "mtp.safetensors"))
    for file in tokenizer_dir.iterdir():
        shutil.copy(file, out_dir / file.name)
    return out_dir, full, extra


class ReferenceMtp:
    def __init__(self, target_dir: Path, full, extra: dict) -> None:
        import transformers

        self.target = transformers.AutoModelForCausalLM.from_pretrained(
            str(target_dir), dtype=torch.float32, attn_implementation="sdpa"
        ).eval()
        full.config._attn_implementation = "sdpa"  # causal without a mask
        self.block, self.rotary = full.model.layers[2].eval(), full.model.rotary_emb
        self.w = {k.removeprefix("model.layers.2."): v.float() for k, v in extra.items()}
        self.eps = full.config.rms_norm_eps

    def drafts(self, token_ids: list[int], k: int) -> list[int]:
        """The layer's ``k`` greedy guesses after ``token_ids`` (the newest one not yet computed by the target)."""
        with torch.no_grad():
            out = self.target(torch.tensor([token_ids[:-1]]), output_hidden_states=True)
            hidden = out.hidden_states[-1][0]  # after the target's final norm
            inputs, guesses = list(token_ids[1:]), []
            for _ in range(k):
                normed, stream = self._forward(torch.tensor(inputs), hidden)
                guesses.append(int(torch.argmax(normed[-1] @ self.w["shared_head.head.weight"].T)))
                inputs.append(guesses[-1])
                hidden = torch.cat([hidden, stream[-1:]])
        return guesses

    def _rms(self, x, name):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.w[name]

    def _forward(self, token_ids: torch.Tensor, hidden: torch.Tensor):
        positions = torch.arange(token_ids.shape[0])
        embeds = self.w["embed_tokens.weight"][token_ids].masked_fill((positions == 0)[:, None], 0.0)
        x = torch.cat([self._rms(embeds, "enorm.weight"), self._rms(hidden, "hnorm.weight")], dim=-1)
        x = (x @ self.w["eh_proj.weight"].T)[None]
        out = self.block(x, attention_mask=None, position_ids=positions[None],
                         position_embeddings=self.rotary(x, positions[None]))
        stream = (out[0] if isinstance(out, tuple) else out)[0]
        return self._rms(stream, "shared_head.norm.weight"), stream
