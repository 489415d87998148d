"""Logit edits through the LLM API on a tiny real model: OpenAI's logit_bias,
vLLM's allowed_token_ids and bad_words, against HF generate's equivalents;
and vLLM's truncate_prompt_tokens."""

from __future__ import annotations

import pytest
import torch

from octavo import SamplingParams
from tests.entrypoints import test_llm_sampling
from tests.entrypoints.test_llm_sampling import PROMPT, tokens
from tests.hf_reference import _hf_model

# The sampling tests' engine fixture (module-scoped: this module builds its own).
llm = test_llm_sampling.llm


def hf_greedy(llama_dir, max_new_tokens: int, **generate_options) -> list[int]:
    model = _hf_model(str(llama_dir), torch.float32)
    ids = torch.tensor([PROMPT])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         min_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0, **generate_options)
    return out[0, len(PROMPT):].tolist()


def test_logit_bias_matches_hf(llm, llama_dir):
    """Greedy with biases that change the output (the unbiased first tokens
    banned, one token raised) equals HF's ``sequence_bias`` on the same model."""
    plain = tokens(llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))[0])
    bias = {plain[0]: -100.0, plain[1]: -100.0, 3: 6.0, 11: -2.5}
    ours = tokens(llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True,
                                                        logit_bias=bias))[0])
    assert ours != plain and plain[0] not in ours
    assert ours == hf_greedy(llama_dir, 16, sequence_bias={(t,): b for t, b in bias.items()})


def test_allowed_token_ids_match_hf_and_bound_sampling(llm, llama_dir):
    allowed = list(range(10, 60, 3))
    greedy = tokens(llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                                                          allowed_token_ids=allowed))[0])
    assert greedy == hf_greedy(llama_dir, 12, prefix_allowed_tokens_fn=lambda batch, sent: allowed)
    sampled = llm.generate([PROMPT], SamplingParams(n=4, temperature=1.5, seed=3, max_tokens=24, ignore_eos=True,
                                                    allowed_token_ids=allowed, logit_bias={10: 3.0}))[0]
    drawn = [t for completion in sampled.outputs for t in completion.token_ids]
    assert set(drawn) <= set(allowed) and len(set(drawn)) > 3


@pytest.mark.parametrize(
    "options, param",
    [
        (dict(logit_bias={5: 101.0}), "logit_bias"),
        (dict(logit_bias={-1: 1.0}), "logit_bias"),
        (dict(logit_bias={"5": 1.0}), "logit_bias"),
        (dict(logit_bias={5: float("nan")}), "logit_bias"),
        (dict(allowed_token_ids=[]), "allowed_token_ids"),
        (dict(allowed_token_ids=[3, -2]), "allowed_token_ids"),
        (dict(allowed_token_ids="abc"), "allowed_token_ids"),
        (dict(logit_bias=[(5, 1.0)]), "logit_bias"),
        (dict(stop_token_ids=7), "stop_token_ids"),
        (dict(bad_words=[" "]), "bad_words"),
        (dict(bad_words=["x"] * 129), "bad_words"),
        (dict(bad_words=["x" * 257]), "bad_words"),
        (dict(bad_words_token_ids=[[]]), "bad_words_token_ids"),
        (dict(bad_words_token_ids=[[1, -1]]), "bad_words_token_ids"),
        (dict(bad_words_token_ids=[list(range(2049))]), "bad_words"),
    ],
)
def test_bad_logit_edits_are_refused(options, param):
    from octavo.errors import InvalidSamplingParamsError

    with pytest.raises(InvalidSamplingParamsError) as error:
        SamplingParams(**options)
    assert error.value.param == param


def test_logit_edits_past_the_vocabulary_are_refused(llm):
    from octavo.errors import InvalidArgumentError

    vocab_size = llm.engine.limits.vocab_size
    for options, param in ((dict(logit_bias={vocab_size: 1.0}), "logit_bias"),
                           (dict(allowed_token_ids=[1, vocab_size]), "allowed_token_ids"),
                           (dict(bad_words_token_ids=[[1, vocab_size]]), "bad_words_token_ids")):
        with pytest.raises(InvalidArgumentError, match=f"token id {vocab_size} is out of range") as error:
            llm.generate([PROMPT], SamplingParams(max_tokens=2, **options))
        assert error.value.param == param
    with pytest.raises(InvalidArgumentError, match=f"more than the vocabulary's {vocab_size}"):
        llm.generate([PROMPT], SamplingParams(max_tokens=2, allowed_token_ids=[1] * (vocab_size + 1)))


def contains(sequence: list[int], part: list[int]) -> bool:
    return any(sequence[i:i + len(part)] == part for i in range(len(sequence) - len(part) + 1))


def round_trip_word(tokenizer, output: list[int], length: int, avoid: set[int] = frozenset()) -> str:
    """The text of the first ``length`` tokens of ``output`` (none in ``avoid``) that
    encode back to themselves."""
    for start in range(len(output) - length + 1):
        span = output[start:start + length]
        text = tokenizer.decode(span)
        if text.strip() and not avoid & set(span) and tokenizer.encode(text.lstrip(), add_special_tokens=False) == span:
            return text
    raise AssertionError(f"no {length}-token word of {output} encodes back to itself")


def test_bad_words_match_hf_and_leave_the_output(llm, llama_dir):
    """Words taken from the plain greedy output (one and several tokens) do not
    appear once banned, and the output equals HF's ``bad_words_ids`` with the
    sequences the engine made of them."""
    from octavo.core.bad_words import bad_words_token_ids

    tokenizer = llm.get_tokenizer()
    plain = tokens(llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))[0])
    one = round_trip_word(tokenizer, plain, 1)
    # A two-token word clear of the one-token word, so that its own ban (on its
    # second token, after its first) is what keeps it out.
    two = round_trip_word(tokenizer, plain, 2, avoid=set(tokenizer.encode(one, add_special_tokens=False)))
    words = [one, two]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, bad_words=words)
    ours = tokens(llm.generate([PROMPT], params)[0])
    sequences = bad_words_token_ids(words, tokenizer)  # what the engine makes of them
    assert sequences and all(not contains(ours, ids) for ids in sequences) and ours != plain
    assert ours == hf_greedy(llama_dir, 24, bad_words_ids=sequences)
    # Token sequences given without words are taken as they are.
    direct = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, bad_words_token_ids=sequences)
    assert tokens(llm.generate([PROMPT], direct)[0]) == ours


def test_bad_words_sequences(llm):
    from octavo.core.bad_words import banned_last_tokens, bad_words_token_ids

    tokenizer = llm.get_tokenizer()
    sequences = bad_words_token_ids(["hello", " hello", "hello world"], tokenizer)
    assert len(sequences) == len({tuple(ids) for ids in sequences})  # no duplicates
    assert tokenizer.encode("hello", add_special_tokens=False) in sequences
    assert banned_last_tokens([[7], [1, 2, 3]], [5, 1, 2]) == [3, 7]
    assert banned_last_tokens([[7], [1, 2, 3]], [1, 2, 5]) == [7]
    assert banned_last_tokens([[1, 2, 3]], [2]) == []


def test_truncate_prompt_tokens_keeps_the_prompts_end(llm):
    """vLLM's left truncation: the output is the output of the prompt's last k tokens;
    -1 keeps as many as leave room for one new token."""
    from octavo.errors import InvalidArgumentError, InvalidSamplingParamsError

    long_prompt = PROMPT * 40  # 360 tokens, past max_model_len (256)
    greedy = dict(temperature=0, max_tokens=6, ignore_eos=True)
    cut = llm.generate([long_prompt], SamplingParams(truncate_prompt_tokens=50, **greedy))[0]
    assert cut.prompt_token_ids == long_prompt[-50:] and cut.prompt is None
    assert tokens(cut) == tokens(llm.generate([long_prompt[-50:]], SamplingParams(**greedy))[0])
    text = llm.get_tokenizer().decode(long_prompt)
    whole = llm.generate(text, SamplingParams(truncate_prompt_tokens=-1, max_tokens=1, ignore_eos=True))[0]
    assert len(whole.prompt_token_ids) == 255 and whole.prompt is None
    short = llm.generate(text[:40], SamplingParams(truncate_prompt_tokens=200, max_tokens=1))[0]
    assert short.prompt == text[:40]  # nothing cut: the text stays
    with pytest.raises(InvalidArgumentError, match=r"must be -1 or in \[1, 255\]"):
        llm.generate([PROMPT], SamplingParams(truncate_prompt_tokens=256, **greedy))
    for bad in (0, -2):
        with pytest.raises(InvalidSamplingParamsError):
            SamplingParams(truncate_prompt_tokens=bad)
