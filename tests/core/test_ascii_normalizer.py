"""The Python stand-in for BERT's normalizer (``ascii_normalizer``) gives the
backend's own ids on every text: the printable ASCII ones it takes, and the
ones it hands back (accents, CJK, control characters, added tokens that
lowercasing would hide or reveal)."""

from __future__ import annotations

import pytest

from octavo.core.ascii_normalizer import encode_ids, plain_copy

WORDS = ["the", "cat", "sits", "on", "mat", "what", "is", "a", "market", "stock", "river", "bank", "##s", "caf", "##e"]
TEXTS = [
    "the cat sits on the mat", "What is a STOCK market?", "CATS, Banks; rivers!", "  spaced\tout\nlines  ",
    "café river", "Ünïcödé bank", "中文 cat", "the [CLS] cat [SEP]", "the [cls] cat", "[MASK]", "cat <Extra> mat",
    "cat <extra> mat", "bell\x07 cat", "", "THE MAT\u00a0cat", "keep stock", "keepstock",
]


def build(lowercase: bool = True, extra_raw: str | None = None, extra_normalized: str | None = None):
    from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers, processors

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {token: i for i, token in enumerate(specials + WORDS + [".", ",", "?", "!", ";"])}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tokenizer.add_special_tokens([AddedToken(t, normalized=False) for t in specials])
    if extra_raw is not None:
        tokenizer.add_tokens([AddedToken(extra_raw, normalized=False)])
    if extra_normalized is not None:
        tokenizer.add_tokens([AddedToken(extra_normalized, normalized=True)])
    return tokenizer


def own(backend, batch):
    return [(e.ids, e.type_ids) for e in backend.encode_batch(batch, add_special_tokens=True)]


def ours(backend, batch):
    ids, types = encode_ids(backend, batch, with_types=True)
    assert encode_ids(backend, batch, with_types=False) == (ids, None)
    return list(zip(ids, types))


@pytest.mark.parametrize("lowercase", [True, False])
@pytest.mark.parametrize("extra_raw", [None, "<Extra>", "<extra>"])
def test_same_ids_as_the_backend(lowercase, extra_raw):
    backend = build(lowercase, extra_raw)
    assert plain_copy(backend) is not None
    assert ours(backend, TEXTS) == own(backend, TEXTS)
    pairs = list(zip(TEXTS, reversed(TEXTS)))
    assert ours(backend, pairs) == own(backend, pairs)


def test_only_printable_ascii_text_free_of_raw_added_tokens_is_taken():
    plain = plain_copy(build())
    assert plain.converts("What is a STOCK market?") == "what is a stock market?"
    for text in ("café", "tab\there", "line\n", "bell\x07", "the [cls] cat", "[CLS]"):
        assert plain.converts(text) is None


def test_a_normalized_added_token_that_lowercasing_changes_keeps_the_backend():
    backend = build(extra_normalized="Stock")
    assert plain_copy(backend) is None
    assert ours(backend, TEXTS) == own(backend, TEXTS)
    backend = build(extra_normalized="keepstock")
    assert plain_copy(backend) is not None
    assert ours(backend, TEXTS) == own(backend, TEXTS)


def test_other_normalizers_keep_the_backend():
    from tokenizers import normalizers

    backend = build()
    backend.normalizer = normalizers.Lowercase()
    assert plain_copy(backend) is None
    assert ours(backend, TEXTS) == own(backend, TEXTS)


def test_a_change_to_the_backend_makes_a_new_copy():
    backend = build()
    first = plain_copy(backend)
    assert plain_copy(backend) is first
    from tokenizers import processors

    backend.post_processor = processors.TemplateProcessing(single="$A [SEP]", special_tokens=[("[SEP]", 3)])
    assert plain_copy(backend) is not first
    assert ours(backend, TEXTS) == own(backend, TEXTS)


TEMPLATES = [
    ("[CLS] $A [SEP]", "[CLS] $A [SEP] $B:1 [SEP]:1"),
    ("$A:1 [SEP]:0 [CLS]:1", "$A $B:1"),  # type ids of all kinds, specials after the text only
    ("[MASK] [CLS]:1 $A", "$A $B"),  # specials before the text only
    ("$A", "$A $B:1"),
    ("[CLS] $A [SEP] [SEP]", "[CLS] $A [SEP] $B [SEP]"),
]


@pytest.mark.parametrize("single, pair", TEMPLATES)
def test_the_template_applied_in_python_gives_the_post_processors_ids(single, pair):
    from tokenizers import processors

    backend = build()
    backend.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=[("[CLS]", 2), ("[SEP]", 3), ("[MASK]", 4)]
    )
    assert plain_copy(backend).template is not None
    assert ours(backend, TEXTS) == own(backend, TEXTS)
    pairs = list(zip(TEXTS, TEXTS[1:]))
    assert ours(backend, pairs) == own(backend, pairs)


def test_a_special_token_of_several_ids():
    from tokenizers import processors

    backend = build()
    backend.post_processor = processors.TemplateProcessing(
        single="[BOTH] $A:1 [SEP]", pair="$A $B", special_tokens=[{"id": "[BOTH]", "ids": [2, 4], "tokens": ["[CLS]", "[MASK]"]}, ("[SEP]", 3)]
    )
    assert ours(backend, TEXTS) == own(backend, TEXTS)


def test_other_post_processors_stay_in_the_library():
    from tokenizers import processors

    backend = build()
    backend.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    assert plain_copy(backend) is not None and plain_copy(backend).template is None
    assert ours(backend, TEXTS) == own(backend, TEXTS)
    backend.post_processor = None
    assert ours(backend, TEXTS) == own(backend, TEXTS)


def test_the_real_minilm_tokenizer_gives_transformers_ids():
    """all-MiniLM-L6-v2's own tokenizer.json, on random sentences of words
    that take both ways (punctuation, specials, accents, CJK, tabs)."""
    import random

    from tests.models.minilm import minilm_path
    from transformers import AutoTokenizer

    from octavo.core.tokenizer import encode_batch_ids

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_path()))
    tokenizer(["reset"])  # transformers' call clears the file's truncation and padding off the backend
    words = ("The quick brown fox, jumps over the lazy dog! What's up? I'm here: e-mail x@y.com 3.14 $100 #tag "
             "C++ don't U.S.A. unaffable GPUs [CLS] [mask] naïve café 北京 Hello\tWorld").split(" ")
    rng = random.Random(0)
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 25))) for _ in range(400)] + ["", " ", "A"]
    assert sum(plain_copy(tokenizer.backend_tokenizer).converts(t) is not None for t in texts) > 50
    expected = tokenizer(texts, add_special_tokens=True, return_token_type_ids=True)
    assert encode_batch_ids(tokenizer, texts, True) == (expected["input_ids"], expected["token_type_ids"])
    pairs = list(zip(texts[:200], texts[200:400]))
    expected = tokenizer(texts[:200], texts[200:400], add_special_tokens=True, return_token_type_ids=True)
    assert encode_batch_ids(tokenizer, pairs, True) == (expected["input_ids"], expected["token_type_ids"])


@pytest.mark.parametrize("extra_raw", [None, "<extra>", "a\nb"])
def test_texts_checked_together_convert_as_each_alone(extra_raw):
    """``converts_all`` gives each text's ``converts``, or None where any text is not the copy's."""
    plain = plain_copy(build(True, extra_raw))
    for texts in (["the Cat", "", "A STOCK market?"], ["the cat", "café"], ["the [CLS] cat"], ["ok", "<EXTRA> mat"],
                  ["tab\tbed"], ["a", "b"], []):
        alone = [plain.converts(text) for text in texts]
        expected = alone if texts and None not in alone else None
        together = plain.converts_all(texts)
        # A raw token holding a newline may send texts that are fine alone the slow way: never the other way round.
        assert together == expected or (together is None and extra_raw == "a\nb")


def test_single_texts_segment_ids_are_known_zero_only_from_a_zero_template():
    from types import SimpleNamespace

    from tokenizers import processors

    from octavo.core.tokenizer import single_types_are_zero

    backend = build()
    assert single_types_are_zero(SimpleNamespace(_tokenizer=backend))
    backend.post_processor = processors.TemplateProcessing(single="[CLS]:1 $A:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    assert not single_types_are_zero(SimpleNamespace(_tokenizer=backend))
    backend.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))  # not a plain template: unknown
    assert not single_types_are_zero(SimpleNamespace(_tokenizer=backend))
