"""Small random-weight checkpoints built with transformers, for tests.

Each architecture gets a distinct twist so that its special path is
exercised: Llama uses llama3 rope scaling and GQA, Mistral ties nothing and
has 1 KV head, Qwen2 ties embeddings (and has qkv bias), Qwen3 has an
explicit head_dim that differs from hidden/heads (and q/k norms).
"""

from __future__ import annotations

from pathlib import Path

import torch

from octavo.default_model import build_byte_bpe_tokenizer

COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=2,
    rms_norm_eps=1e-6,
)

ARCH_OVERRIDES = {
    "llama": dict(
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
    ),
    "mistral": dict(num_key_value_heads=1, sliding_window=None),
    "qwen2": dict(tie_word_embeddings=True),
    "qwen3": dict(head_dim=32, tie_word_embeddings=False),
}

ARCHITECTURES = tuple(ARCH_OVERRIDES)


def _config_and_model(arch: str, vocab_size: int, **overrides):
    import transformers

    classes = {
        "llama": ("LlamaConfig", "LlamaForCausalLM"),
        "mistral": ("MistralConfig", "MistralForCausalLM"),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    }
    config_name, model_name = classes[arch]
    settings = dict(COMMON, vocab_size=vocab_size, **ARCH_OVERRIDES[arch])
    settings.update(overrides)
    config = getattr(transformers, config_name)(**settings)
    return getattr(transformers, model_name)(config)


def build_checkpoint(out_dir: Path, arch: str, tokenizer_dir: Path, seed: int = 0, **overrides) -> Path:
    """Save a random ``arch`` model plus the tokenizer from ``tokenizer_dir``."""
    import shutil

    from tokenizers import Tokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    vocab_size = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size()
    torch.manual_seed(seed)
    model = _config_and_model(arch, vocab_size, **overrides)
    # Larger weights than the default init make logits less flat, so that
    # greedy choices are not near-ties that float rounding could flip.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.normal_(0.0, 0.08)
    model.save_pretrained(str(out_dir))
    for file in tokenizer_dir.iterdir():
        shutil.copy(file, out_dir / file.name)
    return out_dir


def build_tokenizer(out_dir: Path) -> Path:
    build_byte_bpe_tokenizer(out_dir)
    return out_dir
