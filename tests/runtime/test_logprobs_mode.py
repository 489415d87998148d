"""vLLM's ``logprobs_mode``: raw logits are the model's (transformers' on the
same checkpoint), processed logprobs are those of the distribution each
token was drawn from (temperature and top-k applied), with the same tokens;
excluded tokens read -9999; bad modes and speculation with processed
logprobs are refused."""

from __future__ import annotations

import math

import pytest
import torch

from octavo import SamplingParams
from octavo.errors import InvalidArgumentError

PROMPT = [5, 17, 42, 99, 7, 3]


def generate(llm, params):
    completion = llm.generate([{"prompt_token_ids": PROMPT}], params)[0].outputs[0]
    return completion.token_ids, completion.logprobs


def test_raw_logits_are_the_models(llama_dir, make_llm):
    import transformers

    llm = make_llm(llama_dir, logprobs_mode="raw_logits")
    tokens, entries = generate(llm, SamplingParams(temperature=0.0, max_tokens=6, logprobs=3, ignore_eos=True))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(llama_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + list(tokens)])).logits[0]
    for step, (token, entry) in enumerate(zip(tokens, entries)):
        expected = logits[len(PROMPT) - 1 + step]
        assert abs(entry[token].logprob - float(expected[token])) < 1e-4
        assert entry[token].rank == 1  # greedy: the largest logit
    # Speculation verifying drafts reports the same raw logits.
    ngram = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
    spec = make_llm(llama_dir, logprobs_mode="raw_logits", speculative_config=ngram)
    spec_tokens, spec_entries = generate(spec, SamplingParams(temperature=0.0, max_tokens=6, logprobs=3, ignore_eos=True))
    assert spec_tokens == tokens
    for mine, theirs in zip(spec_entries, entries):
        assert mine.keys() == theirs.keys() and all(abs(mine[t].logprob - theirs[t].logprob) < 1e-4 for t in mine)


def test_processed_logprobs_are_the_drawn_distributions(llama_dir, make_llm):
    """The same seeded draws in both modes; processed values are the top-k
    raw logits over the temperature, renormalised; the rest are excluded."""
    params = SamplingParams(temperature=0.7, top_k=4, seed=11, max_tokens=8, logprobs=6, ignore_eos=True)
    raw_tokens, raw = generate(make_llm(llama_dir, logprobs_mode="raw_logits"), params)
    tokens, processed = generate(make_llm(llama_dir, logprobs_mode="processed_logprobs"), params)
    assert tokens == raw_tokens
    for token, raw_entry, entry in zip(tokens, raw, processed):
        top_raw = sorted(raw_entry.items(), key=lambda item: -item[1].logprob)[:4]
        scaled = torch.tensor([lp.logprob / 0.7 for _, lp in top_raw])
        expected = dict(zip([t for t, _ in top_raw], torch.log_softmax(scaled, dim=0).tolist()))
        kept = {t: lp.logprob for t, lp in entry.items() if lp.logprob > -9999.0}
        assert kept.keys() == expected.keys() and token in kept
        assert all(abs(kept[t] - expected[t]) < 1e-4 for t in kept)
        assert math.isclose(sum(math.exp(v) for v in kept.values()), 1.0, rel_tol=1e-4)
        excluded = [lp.logprob for t, lp in entry.items() if t not in kept]
        assert excluded and all(v == -9999.0 for v in excluded)


def test_processed_logits_of_a_greedy_row_are_after_its_edits(llama_dir, make_llm):
    """Greedy rows have no temperature: processed logits are the edited ones (a bias here)."""
    bias = SamplingParams(temperature=0.0, max_tokens=3, logprobs=1, ignore_eos=True, logit_bias={77: 5.0})
    raw_tokens, raw = generate(make_llm(llama_dir, logprobs_mode="raw_logits"), bias)
    tokens, processed = generate(make_llm(llama_dir, logprobs_mode="processed_logits"), bias)
    assert tokens == raw_tokens == [77, 77, 77]
    for entry_raw, entry in zip(raw, processed):
        assert abs(entry[77].logprob - (entry_raw[77].logprob + 5.0)) < 1e-4


def test_bad_modes_are_refused(llama_dir):
    from octavo import LLM

    with pytest.raises(InvalidArgumentError, match="logprobs_mode must be one of"):
        LLM(str(llama_dir), logprobs_mode="softmax")
    ngram = {"method": "ngram", "num_speculative_tokens": 2}
    with pytest.raises(InvalidArgumentError, match="processed_logprobs"):
        LLM(str(llama_dir), logprobs_mode="processed_logprobs", speculative_config=ngram)
