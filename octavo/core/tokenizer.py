"""Tokenizer loading and the few operations the engine needs.

Tokenizers come from Hugging Face (``tokenizer.json`` and its config); no
remote code is ever executed. Incremental decoding uses the ``tokenizers``
library's ``DecodeStream`` when the tokenizer is backed by it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from octavo.errors import ModelLoadError


def load_tokenizer(path: str | Path, chat_template: str | None = None) -> Any:
    """Load the Hugging Face tokenizer stored in ``path`` (offline, no remote code)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False, local_files_only=True)
    except Exception as exc:  # transformers raises many kinds of errors
        raise ModelLoadError(f"could not load a tokenizer from {path}: {exc}") from exc
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


def fast_backend(tokenizer: Any) -> Any | None:
    """The underlying ``tokenizers.Tokenizer``, if the tokenizer has one."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is not None and hasattr(backend, "decode"):
        return backend
    return None


def eos_token_ids(tokenizer: Any | None, *configs: dict) -> frozenset[int]:
    """EOS ids from the model and generation configs and the tokenizer."""
    ids: set[int] = set()
    for config in configs:
        value = config.get("eos_token_id") if config else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(v for v in value if isinstance(v, int))
    if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)
