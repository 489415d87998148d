"""The offline default model: built on first use into the user's cache.

A small Llama checkpoint (seeded random weights) with a byte-level BPE
tokenizer trained on a built-in text, so that ``octavo generate`` works on a
fresh machine with no network. Its output is fluent-looking noise; a trained
demo model replaces it where one ships with the package.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

DEFAULT_MODEL_NAME = "octavo-tiny-random-v1"

_CORPUS = """Once upon a time there was a little fox who lived in a quiet forest.
Every morning the fox walked to the river to drink and to watch the fish.
One day the fox met a small bird who could not fly. The fox asked the bird
what was wrong, and the bird said that its wing was hurt. The fox carried the
bird home and cared for it until the wing was strong again. Then the bird flew
up into the sky and sang a happy song, and the fox smiled.
The sun was warm, the grass was green, and the children played in the park.
Octavo is an engine that serves language models quickly and cheaply.
"""

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def cache_dir() -> Path:
    root = os.environ.get("OCTAVO_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "octavo"
    )
    return Path(root)


def build_byte_bpe_tokenizer(out_dir: Path, corpus: str = _CORPUS, vocab_size: int = 512) -> None:
    """Train a byte-level BPE tokenizer on ``corpus`` and save it HF-style."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([corpus] * 4, trainer=trainer)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "add_bos_token": False,
        "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out_dir / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}, indent=2)
    )


def build_random_llama(out_dir: Path, vocab_size: int, seed: int = 0, **overrides) -> None:
    """Save a small random-weight LlamaForCausalLM (transformers' own class)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    settings = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,
    )
    settings.update(overrides)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**settings))
    model.save_pretrained(str(out_dir))


def default_model_path() -> Path:
    """The packaged demo model if there is one, else the cached random model."""
    packaged = Path(__file__).parent / "assets" / "demo-model"
    if (packaged / "config.json").exists():
        return packaged
    target = cache_dir() / DEFAULT_MODEL_NAME
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    try:
        build_byte_bpe_tokenizer(staging)
        from tokenizers import Tokenizer

        vocab_size = Tokenizer.from_file(str(staging / "tokenizer.json")).get_vocab_size()
        build_random_llama(staging, vocab_size=vocab_size)
        try:
            staging.rename(target)
        except OSError:  # another process finished first
            pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
