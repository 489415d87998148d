"""Texts encoded a space-separated chunk at a time from a cache
(``word_ids``) give the library's own ids: chunks with punctuation, runs of
spaces, WordPiece's pieces, unknown words, the word length limit;
texts holding an added token, and backends whose words the split might not
give, stay with the library."""

from __future__ import annotations

import random
import string

import pytest

from octavo.core import word_ids
from octavo.core.ascii_normalizer import encode_ids, plain_copy
from tests.core.test_ascii_normalizer import build, own


def ours(backend, batch):
    ids, types = encode_ids(backend, batch, with_types=True)
    return list(zip(ids, types))


def random_texts(count: int, seed: int = 0) -> list[str]:
    """Printable ASCII: vocabulary words, pieces, unknown and over-long words, digits, every punctuation mark."""
    rng = random.Random(seed)
    pool = ["the", "cat", "sits", "mat", "market", "stock", "cafe", "cats", "banks", "keepstock", "x" * 120, "42",
            "Stock", "MAT", "zzz", "a1b2"] + list(string.punctuation)
    texts = []
    for _ in range(count):
        parts = [rng.choice(pool) + (rng.choice(string.punctuation) if rng.random() < 0.2 else "")
                 for _ in range(rng.randint(0, 12))]
        texts.append((" " * rng.randint(1, 3)).join(parts))
    return texts


@pytest.mark.parametrize("lowercase", [True, False])
def test_random_printable_texts_give_the_librarys_ids(lowercase):
    backend = build(lowercase)
    assert plain_copy(backend).words is not None
    texts = random_texts(300)
    assert ours(backend, texts) == own(backend, texts)
    assert ours(backend, texts[:50]) == own(backend, texts[:50])  # now from the cache


def test_a_text_with_an_added_token_goes_to_the_library():
    backend = build(lowercase=False, extra_raw="<Extra>")
    texts = ["cat <Extra> mat", "cat<Extra>mat", "the cat", "[CLS] cat"]
    assert not plain_copy(backend).words.takes("\n".join(texts))
    assert ours(backend, texts) == own(backend, texts)


def test_backends_the_split_might_not_match_keep_the_library():
    from tokenizers import pre_tokenizers

    assert plain_copy(build(extra_normalized="keepstock")).words is None  # matched inside words after normalizing
    backend = build()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    assert plain_copy(backend).words is None
    texts = random_texts(40, seed=1)
    assert ours(backend, texts) == own(backend, texts)


def test_the_cache_starts_over_past_its_limit(monkeypatch):
    monkeypatch.setattr(word_ids, "MAX_CHUNKS", 8)
    backend = build()
    words = plain_copy(backend).words
    texts = random_texts(60, seed=2)
    for start in range(0, 60, 10):
        batch = texts[start : start + 10]
        assert ours(backend, batch) == own(backend, batch)
    # At most the limit, or just the words of the call that started it over.
    last_words = set("\n".join(texts[50:]).lower().split())
    assert len(words._cache) <= 8 or set(words._cache) == last_words


def test_the_real_minilm_tokenizer_takes_the_chunk_path_with_transformers_ids():
    from tests.models.minilm import minilm_path
    from transformers import AutoTokenizer

    from octavo.core.tokenizer import encode_batch_ids

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_path()))
    tokenizer(["reset"])  # transformers' call clears the file's truncation and padding off the backend
    assert plain_copy(tokenizer.backend_tokenizer).words is not None
    rng = random.Random(3)
    words = "The quick brown fox, jumps over the lazy dog! What's up? e-mail x@y.com 3.14 $100 C++ unaffable GPUs".split()
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 20))) for _ in range(300)]
    expected = tokenizer(texts, add_special_tokens=True, return_token_type_ids=True)
    for _ in range(2):  # filling the cache, then from it
        assert encode_batch_ids(tokenizer, texts, True) == (expected["input_ids"], expected["token_type_ids"])
