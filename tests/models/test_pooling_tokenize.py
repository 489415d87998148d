"""Pooling inputs tokenized by one call to the tokenizers library
(``encode_batch_ids``) give exactly transformers' ids and segment ids, and the
tokenizer's own call still serves what that call cannot (truncation, a
backend set to truncate)."""

from __future__ import annotations

import pytest

from octavo.core.pooling_params import PoolerConfig
from octavo.core.tokenizer import encode_batch_ids
from octavo.entrypoints.pooling_inputs import _encode_with_transformers, encode_texts

TEXTS = ["the cat sits on the mat", "What is a STOCK market?", "octavo", "Ünïcödé river, bank 🚀 money"]
PAIRS = ["a dog runs", "the market fell", "returns one vector per input", "what"]


@pytest.fixture()
def tokenizer(wordpiece_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(wordpiece_dir))


def pooler(num_token_types: int = 2, lowercase: bool = False) -> PoolerConfig:
    return PoolerConfig(task="embed", output_size=32, num_token_types=num_token_types, lowercase=lowercase)


def test_one_library_call_gives_transformers_ids(tokenizer):
    expected = tokenizer(TEXTS, add_special_tokens=True, return_token_type_ids=True)
    ids, types = encode_batch_ids(tokenizer, TEXTS, with_type_ids=True)
    assert ids == expected["input_ids"] and types == expected["token_type_ids"]
    expected = tokenizer(TEXTS, PAIRS, add_special_tokens=True, return_token_type_ids=True)
    ids, types = encode_batch_ids(tokenizer, list(zip(TEXTS, PAIRS)), with_type_ids=True)
    assert ids == expected["input_ids"] and types == expected["token_type_ids"]
    assert any(any(t) for t in types)  # the pairs' second segments


@pytest.mark.parametrize("lowercase", [False, True])
@pytest.mark.parametrize("num_token_types", [0, 2])
def test_encode_texts_matches_the_tokenizers_own_call(tokenizer, lowercase, num_token_types):
    config = pooler(num_token_types, lowercase)
    for pairs in (None, PAIRS):
        inputs = encode_texts(tokenizer, config, TEXTS, pairs)
        texts = [t.lower() for t in TEXTS] if lowercase else TEXTS
        second = ([t.lower() for t in pairs] if lowercase else pairs) if pairs is not None else None
        ids, types = _encode_with_transformers(tokenizer, config, texts, second, None)
        assert [i.token_ids for i in inputs] == ids
        expected_types = [t if t is not None and any(t) else None for t in (types or [None] * len(ids))]
        assert [i.token_type_ids for i in inputs] == expected_types


def test_a_backend_set_to_truncate_falls_back_to_the_tokenizers_call(tokenizer):
    long_text = " ".join(["the cat sits on the mat"] * 10)
    tokenizer.backend_tokenizer.enable_truncation(max_length=8)
    assert encode_batch_ids(tokenizer, [long_text], with_type_ids=False) is None
    # transformers' call does not truncate unless asked (and resets the backend), nor does encode_texts.
    full = encode_texts(tokenizer, pooler(), [long_text])[0].token_ids
    assert len(full) == 62
    assert encode_batch_ids(tokenizer, [long_text], with_type_ids=False)[0] == [full]


def test_truncation_goes_through_the_tokenizers_call(tokenizer):
    long_text = " ".join(["the cat sits on the mat"] * 10)
    ids = encode_texts(tokenizer, pooler(), [long_text], truncate=10)[0].token_ids
    assert len(ids) == 10 and ids[-1] == tokenizer.sep_token_id
    assert tokenizer.backend_tokenizer.truncation is not None  # what the fast path then steps around
    assert encode_batch_ids(tokenizer, [long_text], with_type_ids=False) is None
