"""A stand-in for gpt-oss's tokenizer and checkpoint, for the harmony parsers'
tests (the real tokenizer is not available offline): the small byte-level BPE
of the other tests plus harmony's markers as special tokens (skipped when a
request skips special tokens, kept when a parser asks for them), a harmony
chat template whose generation prompt is ``<|start|>assistant``, and, like
gpt-oss's ``generation_config.json``, ``<|return|>`` and ``<|call|>`` among
the EOS ids."""

from __future__ import annotations

import json
from pathlib import Path

from tests.checkpoints import build_checkpoint, build_tokenizer

HARMONY_TOKENS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")

# Enough of gpt-oss's template for a conversation: each message in its harmony
# form, the assistant's answers in the final channel.
HARMONY_TEMPLATE = (
    "{%- for message in messages -%}"
    "<|start|>{{ message.role }}{% if message.role == 'assistant' %}<|channel|>final{% endif %}"
    "<|message|>{{ message.content or '' }}<|end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}<|start|>assistant{% endif -%}"
)


def build_harmony_tokenizer(out_dir: Path) -> Path:
    from tokenizers import AddedToken, Tokenizer

    build_tokenizer(out_dir)
    tokenizer = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in HARMONY_TOKENS])
    tokenizer.save(str(out_dir / "tokenizer.json"))
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.update(eos_token="<|return|>", chat_template=HARMONY_TEMPLATE)
    config_path.write_text(json.dumps(config, indent=2))
    special_path = out_dir / "special_tokens_map.json"
    special = json.loads(special_path.read_text())
    special["eos_token"] = "<|return|>"
    special_path.write_text(json.dumps(special, indent=2))
    return out_dir


def token_id(tokenizer_dir: Path, token: str) -> int:
    from tokenizers import Tokenizer

    index = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).token_to_id(token)
    assert index is not None, token
    return index


def build_harmony_checkpoint(out_dir: Path, tokenizer_dir: Path) -> Path:
    """A random gpt-oss (the test family's config) with the harmony tokenizer; its EOS
    ids are gpt-oss's three: ``<|return|>``, the end of text (``</s>`` here), ``<|call|>``."""
    eos = [token_id(tokenizer_dir, "<|return|>"), 1, token_id(tokenizer_dir, "<|call|>")]
    build_checkpoint(out_dir, "gpt_oss", tokenizer_dir, eos_token_id=eos[0])
    (out_dir / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": eos, "pad_token_id": 1}))
    return out_dir
