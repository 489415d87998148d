"""vLLM's ``bad_words``: words the output must not contain, as token sequences.

A word is encoded (without special tokens) as it stands and after a space:
byte-level BPE tokenizers spell a word differently at the start of a text
and inside one (``small`` and `` small``, of different lengths at times).
Where a tokenizer adds a space of its own (SentencePiece's dummy prefix),
the spaced form is the word after one more space token: a sequence that
bans nothing the plain form does not. The sampler bans a sequence's last
token wherever the output so far ends with the tokens before it; a
one-token word is banned everywhere.
"""

from __future__ import annotations

from typing import Any

MAX_BAD_WORDS = 128
MAX_BAD_WORD_CHARS = 256
MAX_BAD_WORDS_TOKENS = 2048  # all of a request's sequences together


def bad_words_token_ids(words: list[str], tokenizer: Any) -> list[list[int]]:
    """The token sequences of ``words`` (each word one or two spellings, no duplicates)."""
    sequences: list[list[int]] = []
    for word in words:
        plain = list(tokenizer.encode(word.lstrip(), add_special_tokens=False))
        spaced = list(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
        for ids in (plain, spaced):
            if ids and ids not in sequences:
                sequences.append(ids)
    return sequences


def banned_last_tokens(sequences: list[list[int]], output_token_ids: list[int]) -> list[int]:
    """The tokens that would complete one of ``sequences`` after ``output_token_ids``."""
    banned = set()
    for ids in sequences:
        prefix = len(ids) - 1
        if prefix == 0 or (len(output_token_ids) >= prefix and output_token_ids[-prefix:] == ids[:-1]):
            banned.add(ids[-1])
    return sorted(banned)
