"""Tokenizer loading and the few operations the engine needs.

Tokenizers come from Hugging Face (``tokenizer.json`` and its config); no
remote code is ever executed. Where ``octavo.core.tokenizer_files`` knows the
files give the same tokenizer as transformers, the ``tokenizers`` library
reads them (``FastTokenizer``: a quarter of a second instead of seconds of
importing transformers); anything else is loaded by transformers'
``AutoTokenizer``. ``OCTAVO_FAST_TOKENIZER=0`` always uses transformers.
Incremental decoding uses the ``tokenizers`` library's ``DecodeStream`` when
the tokenizer is backed by it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from octavo.core.ascii_normalizer import encode_ids, plain_copy
from octavo.errors import ModelLoadError

logger = logging.getLogger(__name__)


def load_tokenizer(path: str | Path, chat_template: str | None = None) -> Any:
    """Load the Hugging Face tokenizer stored in ``path`` (offline, no remote code)."""
    tokenizer = _fast_tokenizer(Path(path)) if os.environ.get("OCTAVO_FAST_TOKENIZER", "1") != "0" else None
    if tokenizer is None:
        tokenizer = load_transformers_tokenizer(path)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


def _fast_tokenizer(path: Path) -> Any | None:
    from octavo.core.tokenizer_files import Unsupported, read_tokenizer_files

    if not path.is_dir():
        return None
    try:
        files = read_tokenizer_files(path)
    except Unsupported as reason:
        logger.info("tokenizer in %s: loading it with transformers (%s)", path, reason)
        return None
    from octavo.core.fast_tokenizer import FastTokenizer

    try:
        return FastTokenizer(files)
    except Exception as exc:  # a tokenizer.json the library refuses: transformers says why
        logger.info("tokenizer in %s: loading it with transformers (tokenizers: %s)", path, exc)
        return None


def load_transformers_tokenizer(path: str | Path) -> Any:
    """transformers' ``AutoTokenizer`` for ``path`` (offline, no remote code)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False, local_files_only=True)
    except Exception as exc:  # transformers raises many kinds of errors
        raise ModelLoadError(f"could not load a tokenizer from {path}: {exc}") from exc


def transformers_tokenizer(tokenizer: Any) -> Any:
    """The transformers tokenizer behind ``tokenizer`` (for libraries that need
    one, like xgrammar): a ``FastTokenizer`` loads it, any other is one."""
    loader = getattr(type(tokenizer), "transformers_tokenizer", None)
    return loader(tokenizer) if loader is not None else tokenizer


def fast_backend(tokenizer: Any) -> Any | None:
    """The underlying ``tokenizers.Tokenizer``, if the tokenizer has one."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is not None and hasattr(backend, "decode"):
        return backend
    return None


def encode_batch_ids(
    tokenizer: Any, batch: list[str] | list[tuple[str, str]], with_type_ids: bool
) -> tuple[list[list[int]], list[list[int]] | None] | None:
    """``tokenizer(batch)``'s ids (and segment ids), unpadded and untruncated,
    from one call to the ``tokenizers`` library without offsets.

    Half the time of going through transformers (no offsets to compute, no
    per-text conversion to its ``BatchEncoding``), and the same ids: the same
    backend encodes with the same settings. None where they could differ: a
    tokenizer class that wraps its own call, or a backend set to truncate or
    pad (transformers' call would reset that first), or one whose handling of
    special tokens in text is not the tokenizer's."""
    backend = fast_backend(tokenizer)
    if backend is None or not _plain_call(type(tokenizer)):
        return None
    if backend.truncation is not None or backend.padding is not None:
        return None
    if backend.encode_special_tokens != bool(getattr(tokenizer, "split_special_tokens", False)):
        return None
    return encode_ids(backend, batch, with_type_ids)


def single_types_are_zero(tokenizer: Any) -> bool:
    """Whether a single text's segment ids are known to be all 0: where the
    backend's post-processor is a plain template (``ascii_normalizer``'s copy
    holds it) with zeros throughout. False where unknown."""
    backend = fast_backend(tokenizer)
    plain = plain_copy(backend) if backend is not None else None
    return plain is not None and plain.template is not None and plain.template.zero_types


def encodes_in_python(tokenizer: Any) -> bool:
    """Whether ``encode_batch_ids`` encodes this tokenizer's printable-ASCII
    texts mostly in Python (``word_ids``' chunk cache), holding the GIL: a
    background thread tokenizing them gains nothing beside the engine's own
    Python and delays it at every hand-over of the GIL."""
    backend = fast_backend(tokenizer)
    plain = plain_copy(backend) if backend is not None else None
    return plain is not None and plain.words is not None


def _plain_call(tokenizer_class: type) -> bool:
    """Whether ``tokenizer_class(...)(texts)`` is transformers' own call straight to its backend."""
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return False
    return (
        tokenizer_class.__call__ is PreTrainedTokenizerBase.__call__
        and getattr(tokenizer_class, "_encode_plus", None) is TokenizersBackend._encode_plus
    )


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
