"""BERT's normalizer done in Python for printable ASCII text (issue 21).

``BertNormalizer`` (clean the text, space out CJK characters, strip accents,
lowercase) costs the ``tokenizers`` library about as much as all the rest of
encoding a short sentence: it keeps every character's alignment for offsets
nobody asks for here (7.8 -> 4.5 ms for 256 MiniLM-sized sentences). On
printable ASCII text it can do nothing but lowercase: there are no control
characters to clean, no CJK, and NFD leaves ASCII as it is. So such texts
are lowercased by ``str.lower`` (the same mapping on ASCII as Rust's) and
encoded by a copy of the backend without a normalizer; every other text goes
to the backend itself, and the ids are the same either way. Single texts
through the copy also skip a plain ``TemplateProcessing`` post-processor,
whose template is applied in Python (``template_ids``).

Added tokens are what could tell the two apart. Tokens matched on the raw
text (``normalized=False``, like ``[CLS]``) would be looked for in the
lowercased text instead, so a text holding one (lowercased) goes the slow
way. Tokens matched on normalized text are normalized themselves by the
backend, not by the copy, so a backend with any that lowercasing changes is
left alone.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from typing import Any

from octavo.core.template_ids import SingleTemplate
from octavo.core.word_ids import WordIds

Item = str | tuple[str, str]


@dataclass(frozen=True)
class PlainCopy:
    """The backend less its normalizer, and what decides which texts it may encode."""

    backend: Any
    lowercase: bool
    # The lowercased raw-matched added tokens (None when nothing is lowercased).
    raw_tokens: re.Pattern | None
    # The copy less its post-processor too, and that post-processor's single
    # template, applied in Python (``template_ids``); None where it is not one.
    bare: Any = None
    template: SingleTemplate | None = None
    # Single texts' ids a space-separated chunk at a time from a cache (``word_ids``), for BERT's pre-tokenizer.
    words: WordIds | None = None

    def converts(self, text: str) -> str | None:
        """``text`` as the normalizer leaves it, or None where the copy may not encode it."""
        if not (text.isascii() and text.isprintable()):
            return None
        if not self.lowercase:
            return text
        lowered = text.lower()
        return None if self.raw_tokens is not None and self.raw_tokens.search(lowered) else lowered

    def converts_all(self, texts: list[str]) -> list[str] | None:
        """``converts`` of every text, checked on the texts joined (one C call
        each instead of per text); None unless the copy may encode them all."""
        joined = "".join(texts)
        if not texts or not (joined.isascii() and joined.isprintable()):
            return None
        if not self.lowercase:
            return texts
        # No text holds a newline (not printable): it splits the lowered texts apart again.
        lowered = "\n".join(texts).lower()
        if self.raw_tokens is not None and self.raw_tokens.search(lowered):
            return None  # one of the texts holds a raw token (or a token holding a newline spans two)
        return lowered.split("\n")

    def encode(self, batch: list[Item], with_types: bool) -> tuple[list[list[int]], list[list[int]] | None]:
        """Converted texts' ids (and segment ids)."""
        if self.template is None or not all(isinstance(item, str) for item in batch):
            return _ids(_encode(self.backend, batch), with_types)
        template = self.template
        if self.words is not None and self.words.takes("\n".join(batch)):
            text_ids = self.words.ids(batch)
        else:
            text_ids = [e.ids for e in _encode(self.bare, batch)]
        return [template.ids(ids) for ids in text_ids], ([template.type_ids(len(ids)) for ids in text_ids] if with_types else None)


# id(backend) -> (backend, its settings, its copy or None): the backend is
# held so that its id is not reused.
_copies: dict[int, tuple[Any, tuple, PlainCopy | None]] = {}
_lock = threading.Lock()


def encode_ids(backend: Any, batch: list[Item], with_types: bool) -> tuple[list[list[int]], list[list[int]] | None]:
    """The ids (and segment ids) of ``backend.encode_batch_fast(batch)`` with
    special tokens, through the copy for the texts where it gives the same."""
    plain = plain_copy(backend)
    if plain is None:
        return _ids(_encode(backend, batch), with_types)
    if all(isinstance(item, str) for item in batch):
        converted_all = plain.converts_all(batch)
        if converted_all is not None:
            return plain.encode(converted_all, with_types)
    converted, slow = [], []
    for index, item in enumerate(batch):
        parts = (item,) if isinstance(item, str) else item
        done = [plain.converts(part) for part in parts]
        if None in done:
            slow.append(index)
        else:
            converted.append(done[0] if isinstance(item, str) else tuple(done))
    ids, types = plain.encode(converted, with_types)
    if not slow:
        return ids, types
    slow_ids, slow_types = _ids(_encode(backend, [batch[i] for i in slow]), with_types)
    return _merge(len(batch), slow, slow_ids, ids), _merge(len(batch), slow, slow_types, types) if with_types else None


def _encode(backend: Any, batch: list[Item]) -> list[Any]:
    encode = getattr(backend, "encode_batch_fast", None) or backend.encode_batch
    return encode(batch, add_special_tokens=True) if batch else []


def _ids(encodings: list[Any], with_types: bool) -> tuple[list[list[int]], list[list[int]] | None]:
    return [e.ids for e in encodings], ([e.type_ids for e in encodings] if with_types else None)


def _merge(size: int, slow: list[int], slow_rows: list, fast_rows: list) -> list:
    slow_at, fast = dict(zip(slow, slow_rows)), iter(fast_rows)
    return [slow_at[index] if index in slow_at else next(fast) for index in range(size)]


def _key(backend: Any) -> tuple:
    """What the copy depends on and a caller might change after it was made."""
    components = (backend.normalizer, backend.pre_tokenizer, backend.post_processor)
    states = tuple(None if c is None else c.__getstate__() for c in components)
    return (*states, backend.get_vocab_size(with_added_tokens=True), backend.encode_special_tokens)


def plain_copy(backend: Any) -> PlainCopy | None:
    """The backend's copy without its normalizer, made once; None where it would not give the same ids."""
    key = _key(backend)
    with _lock:
        held = _copies.get(id(backend))
        if held is not None and held[0] is backend and held[1] == key:
            return held[2]
        plain = _make_copy(backend)
        _copies[id(backend)] = (backend, key, plain)
        return plain


def _make_copy(backend: Any) -> PlainCopy | None:
    from tokenizers import Tokenizer

    normalizer = backend.normalizer
    if normalizer is None or type(normalizer).__name__ != "BertNormalizer":
        return None
    lowercase = bool(json.loads(normalizer.__getstate__()).get("lowercase"))
    raw, normalized = [], []
    for token in backend.get_added_tokens_decoder().values():
        (normalized if token.normalized else raw).append(token.content)
    # The backend normalizes these before matching them, the copy would not.
    if any(not (t.isascii() and t.isprintable()) or (lowercase and t != t.lower()) for t in normalized):
        return None
    copy = Tokenizer.from_str(backend.to_str())
    copy.normalizer = None
    copy.no_truncation()
    copy.no_padding()
    copy.encode_special_tokens = backend.encode_special_tokens
    pattern = None
    if lowercase and raw:
        pattern = re.compile("|".join(re.escape(t.lower()) for t in sorted(raw, key=len, reverse=True)))
    template = SingleTemplate.of(backend.post_processor)
    bare = words = None
    if template is not None:
        bare = Tokenizer.from_str(copy.to_str())
        bare.post_processor = None
        bare.encode_special_tokens = backend.encode_special_tokens
        words = WordIds.of(backend, bare)
    return PlainCopy(copy, lowercase, pattern, bare, template, words)
