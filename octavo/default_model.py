"""The offline default model: the demo checkpoint that ships with the package.

``LLM()``, ``octavo generate`` and ``octavo serve`` use it when no model is
given. It is a small Llama (about 1.75M parameters, float32, about 7 MB)
trained by ``scripts/train_demo_model.py`` on generated children's stories and
simple question-and-answer chat turns, so that a first command on a machine
with no network writes real text; docs/demo_model.md says how it was made.

It lives in ``octavo/assets/demo-model/`` as package data. A missing copy is a
broken install and raises ``ModelNotFoundError``; nothing is built or fetched
in its place.

This module also holds ``build_byte_bpe_tokenizer``, the tiny tokenizer that
test fixtures pair with random-weight checkpoints, and ``CHAT_TEMPLATE``, the
chat format of both.
"""

from __future__ import annotations

import json
from pathlib import Path

from octavo.errors import ModelNotFoundError

DEFAULT_MODEL_NAME = "octavo-demo"
DEMO_MODEL_DIR = Path(__file__).parent / "assets" / "demo-model"

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


def default_model_path() -> Path:
    """The packaged demo model's directory."""
    if not (DEMO_MODEL_DIR / "config.json").exists():
        raise ModelNotFoundError(
            f"the built-in demo model is missing from {DEMO_MODEL_DIR} (a broken install?); "
            "reinstall octavo or pass a model"
        )
    return DEMO_MODEL_DIR
