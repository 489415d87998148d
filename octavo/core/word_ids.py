"""A BERT tokenizer's ids of printable-ASCII texts, a chunk at a time from a cache (issue 21).

Encoding 256 short sentences with a BERT tokenizer costs the ``tokenizers``
library about 0.9 us a token even without its normalizer (3.4 ms for
all-MiniLM-sized sentences on one core; 6.8 ms with the normalizer on the
GPU machine's host): for every text it builds an ``Encoding`` (tokens,
offsets, masks) and runs WordPiece over every word again. An embedding
batch repeats the same few thousand words, so here each space-separated
chunk's ids are asked of the library once and kept; a text is then its
chunks' ids joined.

Only the split at spaces is done here (``str.split``), and only where it
is the library's first step: ``BertPreTokenizer`` on printable ASCII (what
``ascii_normalizer`` hands over, where the space is the only whitespace)
splits at whitespace before anything else, so a text's ids are its
space-separated chunks' ids joined. Each new chunk ("market?") goes to the
library alone (``encode_batch_fast`` of the missing chunks, no special
tokens), so the split at punctuation, WordPiece, its unknown token and its
word length limit stay the library's. Texts holding an added token's text
are not taken (the library splits those out before the words).

The cache is shared by the threads that tokenize (the server's pool): its
reads and updates are single dict operations, and a thread that finds it
started over meanwhile asks the library again.
"""

from __future__ import annotations

import re
from itertools import chain
from typing import Any

# Chunks kept at most; the cache starts over past it (a server sees new chunks forever).
MAX_CHUNKS = 1 << 17


class WordIds:
    """Ids of texts through a per-chunk cache; ``bare`` is the backend less its
    normalizer and post-processor (``ascii_normalizer.PlainCopy.bare``)."""

    def __init__(self, bare: Any, added_tokens: list[str]) -> None:
        self.bare = bare
        self._cache: dict[str, tuple[int, ...]] = {}
        self._added = re.compile("|".join(map(re.escape, added_tokens))) if added_tokens else None

    @classmethod
    def of(cls, backend: Any, bare: Any) -> WordIds | None:
        """For a backend that splits at whitespace first (BERT's pre-tokenizer; the
        model then sees each piece of a chunk alone, whatever it is), else None."""
        if type(backend.pre_tokenizer).__name__ != "BertPreTokenizer":
            return None
        if backend.encode_special_tokens:
            return None
        added = backend.get_added_tokens_decoder().values()
        # Added tokens matched after normalizing could hide in a word: leave such backends to the library.
        if any(token.normalized for token in added):
            return None
        return cls(bare, [token.content for token in added])

    def takes(self, joined: str) -> bool:
        """Whether the texts (joined) hold no added token's text."""
        return self._added is None or self._added.search(joined) is None

    def ids(self, texts: list[str]) -> list[list[int]]:
        """Each text's ids (no special tokens), in order."""
        chunks = [text.split() for text in texts]
        cache = self._cache
        try:
            return [list(chain.from_iterable(map(cache.__getitem__, text_chunks))) for text_chunks in chunks]
        except KeyError:
            cache = self._learn({chunk for text_chunks in chunks for chunk in text_chunks})
            return [list(chain.from_iterable(map(cache.__getitem__, text_chunks))) for text_chunks in chunks]

    def _learn(self, call_chunks: set[str]) -> dict[str, tuple[int, ...]]:
        """Ask the library for the ids of ``call_chunks`` not yet kept; returns the cache holding them all."""
        cache = self._cache
        new_chunks = call_chunks.difference(cache)
        if len(cache) + len(new_chunks) > MAX_CHUNKS:
            cache, new_chunks = {}, call_chunks
        ordered = sorted(new_chunks)
        encodings = self.bare.encode_batch_fast(ordered, add_special_tokens=False)
        cache.update(zip(ordered, (tuple(e.ids) for e in encodings)))
        self._cache = cache
        return cache
