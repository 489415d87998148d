"""Small EAGLE-3 heads for the test checkpoints, in both layouts, and a
plain-torch reference of what such a head guesses: no KV cache, every
position recomputed, the target's hidden states taken from transformers'
own forward by hooks."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F


def build_eagle3_head(
    out_dir: Path, target_dir: Path, *, aux_layer_ids=(0, 1, 2), draft_vocab_size: int | None = 300,
    speculators: bool = False, own_embeddings: bool = True, seed: int = 3, repeats: bool = False,
) -> Path:
    """A random EAGLE-3 head for the target in ``target_dir``: EAGLE's layout
    (``midlayer.``, ``eagle_config``) or the speculators library's.
    ``repeats``: a head whose layer adds nothing and that reads the stream
    after the target's last layer (the last of ``aux_layer_ids``) through
    the target's final norm and LM head: it guesses the target's newest
    token again and again, so that drafts are accepted where the target
    repeats itself."""
    target = json.loads((target_dir / "config.json").read_text())
    hidden, inter, vocab = target["hidden_size"], target["intermediate_size"], target["vocab_size"]
    heads, kv_heads, head_dim = target["num_attention_heads"], target["num_key_value_heads"], target["head_dim"]
    draft_vocab = draft_vocab_size or vocab
    gen = torch.Generator().manual_seed(seed)

    def weight(*shape):
        return torch.randn(*shape, generator=gen) * 0.08

    def norm():
        return 1.0 + 0.1 * torch.randn(hidden, generator=gen)

    layer = "layers.0." if speculators else "midlayer."
    tensors = {
        "fc.weight": weight(hidden, 3 * hidden),
        f"{layer}self_attn.q_proj.weight": weight(heads * head_dim, 2 * hidden),
        f"{layer}self_attn.k_proj.weight": weight(kv_heads * head_dim, 2 * hidden),
        f"{layer}self_attn.v_proj.weight": weight(kv_heads * head_dim, 2 * hidden),
        f"{layer}self_attn.o_proj.weight": weight(hidden, heads * head_dim),
        f"{layer}input_layernorm.weight": norm(),
        f"{layer}hidden_norm.weight": norm(),
        f"{layer}post_attention_layernorm.weight": norm(),
        f"{layer}mlp.gate_proj.weight": weight(inter, hidden),
        f"{layer}mlp.up_proj.weight": weight(inter, hidden),
        f"{layer}mlp.down_proj.weight": weight(hidden, inter),
        "norm.weight": norm(),
    }
    if repeats:
        from safetensors.torch import load_file

        target_weights = load_file(str(target_dir / "model.safetensors"))
        tensors["fc.weight"] = torch.cat([torch.zeros(hidden, 2 * hidden), torch.eye(hidden)], dim=1)
        tensors[f"{layer}self_attn.o_proj.weight"].zero_()
        tensors[f"{layer}mlp.down_proj.weight"].zero_()
        tensors["norm.weight"] = target_weights["model.norm.weight"]
        own_embeddings, draft_vocab = False, vocab
    if draft_vocab != vocab:
        kept = torch.sort(torch.randperm(vocab, generator=gen)[:draft_vocab]).values
        tensors["d2t"] = kept - torch.arange(draft_vocab)
        tensors["t2d"] = torch.zeros(vocab, dtype=torch.bool).index_fill_(0, kept, True)
    if own_embeddings:
        tensors["embed_tokens.weight"] = weight(vocab, hidden)
    if own_embeddings or draft_vocab != vocab:
        tensors["lm_head.weight"] = weight(draft_vocab, hidden)
    layer_config = {
        key: target[key] for key in (
            "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "rms_norm_eps", "rope_parameters", "max_position_embeddings", "vocab_size", "hidden_act",
        )
    }
    layer_config.update(num_hidden_layers=1, model_type="llama", tie_word_embeddings=False)
    if speculators:
        config = {
            "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
            "transformer_layer_config": layer_config, "draft_vocab_size": draft_vocab,
            "eagle_aux_hidden_state_layer_ids": list(aux_layer_ids),
            "speculators_config": {"proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                   "verifier": {"name_or_path": str(target_dir)}},
        }
    else:
        config = {**layer_config, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": draft_vocab,
                  "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(aux_layer_ids), "use_aux_hidden_state": True}}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config))
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out_dir / "model.safetensors"))
    return out_dir


class ReferenceEagle3:
    """What the head in ``head_dir`` guesses after a sequence, for the target in ``target_dir``."""

    def __init__(self, head_dir: Path, target_dir: Path, aux_layer_ids=(0, 1, 2)) -> None:
        import transformers
        from safetensors.torch import load_file

        self.target = transformers.AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
        raw = json.loads((head_dir / "config.json").read_text())
        self.norm_before_residual = bool(raw.get("norm_before_residual", "speculators_model_type" in raw))
        config = raw.get("transformer_layer_config", raw)
        self.heads, self.kv_heads, self.head_dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
        self.eps = config["rms_norm_eps"]
        self.rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(
            transformers.LlamaConfig(**{k: v for k, v in config.items() if k != "architectures"})
        )
        weights = {k.replace("midlayer.", "layers.0."): v.float() for k, v in load_file(str(head_dir / "model.safetensors")).items()}
        weights.setdefault("embed_tokens.weight", self.target.model.embed_tokens.weight.detach())
        weights.setdefault("lm_head.weight", self.target.lm_head.weight.detach())
        self.w = weights
        self.d2t = weights.get("d2t", torch.zeros(weights["lm_head.weight"].shape[0])).long()
        self.aux_layer_ids = aux_layer_ids

    def target_aux(self, token_ids: list[int]) -> torch.Tensor:
        """The stream entering each chosen layer (the last index: after the last layer), side by side."""
        layers, kept = self.target.model.layers, {}

        def before(index):
            def hook(module, args, kwargs):
                kept[index] = (kwargs.get("hidden_states") if "hidden_states" in kwargs else args[0]).detach()
            return hook

        def after(module, args, output):
            kept[len(layers)] = (output[0] if isinstance(output, tuple) else output).detach()

        handles = [layer.register_forward_pre_hook(before(i), with_kwargs=True) for i, layer in enumerate(layers)]
        handles.append(layers[-1].register_forward_hook(after))
        try:
            with torch.no_grad():
                self.target(torch.tensor([token_ids]))
        finally:
            for handle in handles:
                handle.remove()
        return torch.cat([kept[i][0] for i in self.aux_layer_ids], dim=-1)

    def drafts(self, token_ids: list[int], k: int) -> list[int]:
        """The head's ``k`` greedy guesses after ``token_ids`` (the newest one not yet computed by the target)."""
        w = self.w
        with torch.no_grad():
            hidden = self.target_aux(token_ids[:-1]) @ w["fc.weight"].T
            inputs = list(token_ids[1:])
            guesses = []
            for _ in range(k):
                normed, stream = self._forward(torch.tensor(inputs), hidden)
                guess = int(torch.argmax(normed[-1] @ w["lm_head.weight"].T))
                guesses.append(guess + int(self.d2t[guess]))
                inputs.append(guesses[-1])
                hidden = torch.cat([hidden, stream[-1:]])
        return guesses

    def _rms(self, x, name):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.w[name]

    def _forward(self, token_ids: torch.Tensor, hidden: torch.Tensor):
        w = self.w
        embeds = self._rms(w["embed_tokens.weight"][token_ids], "layers.0.input_layernorm.weight")
        normed_hidden = self._rms(hidden, "layers.0.hidden_norm.weight")
        residual = normed_hidden if self.norm_before_residual else hidden
        stream = self._layer(torch.cat([embeds, normed_hidden], dim=-1), residual)
        return self._rms(stream, "norm.weight"), stream

    def _layer(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """Layer 0's attention (causal, RoPE) and MLP over ``x``, added to ``residual``: the stream after it."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        w, n = self.w, x.shape[0]
        q = (x @ w["layers.0.self_attn.q_proj.weight"].T).view(n, self.heads, self.head_dim).transpose(0, 1)
        k = (x @ w["layers.0.self_attn.k_proj.weight"].T).view(n, self.kv_heads, self.head_dim).transpose(0, 1)
        v = (x @ w["layers.0.self_attn.v_proj.weight"].T).view(n, self.kv_heads, self.head_dim).transpose(0, 1)
        cos, sin = self.rotary(v, torch.arange(n)[None])
        q, k = apply_rotary_pos_emb(q[None], k[None], cos, sin)
        repeat = self.heads // self.kv_heads
        k, v = k[0].repeat_interleave(repeat, 0), v.repeat_interleave(repeat, 0)
        attn = F.scaled_dot_product_attention(q[0], k, v, is_causal=True)
        residual = residual + attn.transpose(0, 1).reshape(n, -1) @ w["layers.0.self_attn.o_proj.weight"].T
        y = self._rms(residual, "layers.0.post_attention_layernorm.weight")
        mlp = F.silu(y @ w["layers.0.mlp.gate_proj.weight"].T) * (y @ w["layers.0.mlp.up_proj.weight"].T)
        return residual + mlp @ w["layers.0.mlp.down_proj.weight"].T


def build_eagle1_head(out_dir: Path, target_dir: Path, *, para_norms: bool = False, own_embeddings: bool = False,
                      fc_bias: bool = True, seed: int = 4) -> Path:
    """A random EAGLE-1 head (EAGLE's layout: ``fc``, ``layers.0`` without an input norm) for the target in ``target_dir``."""
    target = json.loads((target_dir / "config.json").read_text())
    hidden, inter, vocab = target["hidden_size"], target["intermediate_size"], target["vocab_size"]
    heads, kv_heads, head_dim = target["num_attention_heads"], target["num_key_value_heads"], target["head_dim"]
    gen = torch.Generator().manual_seed(seed)

    def weight(*shape):
        return torch.randn(*shape, generator=gen) * 0.08

    tensors = {
        "fc.weight": weight(hidden, 2 * hidden),
        "layers.0.self_attn.q_proj.weight": weight(heads * head_dim, hidden),
        "layers.0.self_attn.k_proj.weight": weight(kv_heads * head_dim, hidden),
        "layers.0.self_attn.v_proj.weight": weight(kv_heads * head_dim, hidden),
        "layers.0.self_attn.o_proj.weight": weight(hidden, heads * head_dim),
        "layers.0.post_attention_layernorm.weight": 1.0 + 0.1 * torch.randn(hidden, generator=gen),
        "layers.0.mlp.gate_proj.weight": weight(inter, hidden),
        "layers.0.mlp.up_proj.weight": weight(inter, hidden),
        "layers.0.mlp.down_proj.weight": weight(hidden, inter),
    }
    if fc_bias:
        tensors["fc.bias"] = weight(hidden)
    if own_embeddings:
        tensors["embed_tokens.weight"] = weight(vocab, hidden)
    if para_norms:
        tensors["embedding_layernorm.weight"] = 1.0 + 0.1 * torch.randn(hidden, generator=gen)
        tensors["hidden_states_layernorm.weight"] = 1.0 + 0.1 * torch.randn(hidden, generator=gen)
    config = {key: target[key] for key in (
        "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
        "rope_parameters", "max_position_embeddings", "vocab_size", "hidden_act")}
    config.update(architectures=["LlamaForCausalLM"], model_type="llama", num_hidden_layers=1, add_para_norm=para_norms)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config))
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out_dir / "model.safetensors"))
    return out_dir


class ReferenceEagle1(ReferenceEagle3):
    """What an EAGLE-1 head guesses: the target's final (normed) hidden state in, the target's LM head out."""

    def __init__(self, head_dir: Path, target_dir: Path) -> None:
        super().__init__(head_dir, target_dir, aux_layer_ids=())
        self.para_norms = json.loads((head_dir / "config.json").read_text()).get("add_para_norm", False)

    def drafts(self, token_ids: list[int], k: int) -> list[int]:
        w = self.w
        with torch.no_grad():
            out = self.target(torch.tensor([token_ids[:-1]]), output_hidden_states=True)
            hidden, inputs, guesses = out.hidden_states[-1][0], list(token_ids[1:]), []
            for _ in range(k):
                stream = self._eagle1(torch.tensor(inputs), hidden)
                guesses.append(int(torch.argmax(stream[-1] @ w["lm_head.weight"].T)))
                inputs.append(guesses[-1])
                hidden = torch.cat([hidden, stream[-1:]])
        return guesses

    def _eagle1(self, token_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        w = self.w
        embeds = w["embed_tokens.weight"][token_ids]
        if self.para_norms:
            embeds, hidden = self._rms(embeds, "embedding_layernorm.weight"), self._rms(hidden, "hidden_states_layernorm.weight")
        x = torch.cat([embeds, hidden], dim=-1) @ w["fc.weight"].T + w.get("fc.bias", 0.0)
        return self._layer(x, x)  # its first layer reads fc's output without a norm
