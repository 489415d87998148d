"""``LLM.beam_search`` against the same search run on Hugging Face's model
(float32, CPU): the same beams, in the same order, with the same cumulative
logprobs; and the search's rules on made-up candidates (EOS, ignore_eos,
length penalty) and its refusals."""

from __future__ import annotations

import pytest
import torch

from octavo.core.outputs import CompletionOutput, Logprob
from octavo.entrypoints.beam_search import BeamSearch, BeamSearchParams, BeamSearchSequence, beam_score
from octavo.errors import InvalidArgumentError
from tests.hf_reference import _hf_model

PROMPTS = [[1, 45, 99, 173], [1, 90, 25, 263, 31]]  # the tiny Llama's vocabulary is small


def hf_beam_search(path, prompt: list[int], params: BeamSearchParams, eos: frozenset[int]) -> list[tuple[list[int], float]]:
    """The same rules, on HF's logits: (generated ids, cumulative logprob), best first."""
    model = _hf_model(str(path), torch.float32)

    def score(beam):
        tokens, cum = beam
        return cum / ((len(tokens) - (1 if tokens[-1] in eos else 0)) ** params.length_penalty)

    beams, finished = [(list(prompt), 0.0)], []
    for _ in range(params.max_tokens):
        if not beams:
            break
        candidates = []
        for tokens, cum in beams:
            with torch.no_grad():
                logits = model(torch.tensor([tokens])).logits[0, -1].float()
            top = torch.topk(torch.log_softmax(logits, dim=-1), 2 * params.beam_width)
            for value, token_id in zip(top.values.tolist(), top.indices.tolist()):
                extended = (tokens + [token_id], cum + value)
                (finished if token_id in eos and not params.ignore_eos else candidates).append(extended)
        beams = sorted(candidates, key=score, reverse=True)[: params.beam_width]
    best = sorted(finished + beams, key=score, reverse=True)[: params.beam_width]
    return [(tokens[len(prompt):], cum) for tokens, cum in best]


@pytest.mark.parametrize("length_penalty", [1.0, 0.0])
def test_beams_equal_the_same_search_on_hf(make_llm, llama_dir, length_penalty):
    llm = make_llm(llama_dir, enable_prefix_caching=True)
    params = BeamSearchParams(beam_width=3, max_tokens=5, length_penalty=length_penalty)
    outputs = llm.beam_search([{"prompt_token_ids": p} for p in PROMPTS], params)
    eos = llm.engine.limits.eos_token_ids
    for prompt, output in zip(PROMPTS, outputs):
        expected = hf_beam_search(llama_dir, prompt, params, eos)
        assert [beam.output_token_ids for beam in output.sequences] == [ids for ids, _ in expected]
        for beam, (_, cum) in zip(output.sequences, expected):
            assert beam.cum_logprob == pytest.approx(cum, abs=1e-4)
            assert beam.tokens[: len(prompt)] == prompt and len(beam.logprobs) == len(beam.output_token_ids)
            assert beam.text == llm.get_tokenizer().decode(beam.output_token_ids, skip_special_tokens=True)


def test_refusals(make_llm, llama_dir):
    with pytest.raises(InvalidArgumentError):
        BeamSearchParams(beam_width=0, max_tokens=4)
    with pytest.raises(InvalidArgumentError) as caught:
        BeamSearchParams(beam_width=2, max_tokens=4, temperature=0.7)
    assert caught.value.param == "temperature"
    llm = make_llm(llama_dir)
    with pytest.raises(InvalidArgumentError) as caught:
        llm.beam_search([PROMPTS[0]], BeamSearchParams(beam_width=11, max_tokens=2))
    assert caught.value.param == "beam_width"  # 22 logprobs a step, over the default 20
    with pytest.raises(InvalidArgumentError) as caught:
        llm.beam_search([PROMPTS[0]], BeamSearchParams(beam_width=2, max_tokens=10_000))
    assert caught.value.param == "max_tokens"


def step(entries: list[dict[int, float]]) -> list[CompletionOutput]:
    return [CompletionOutput(0, "", [], logprobs=[{t: Logprob(lp) for t, lp in entry.items()}]) for entry in entries]


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_eos_candidates_finish_unless_ignored(ignore_eos):
    eos = frozenset({2})
    search = BeamSearch([1, 5], BeamSearchParams(beam_width=2, max_tokens=2, ignore_eos=ignore_eos), eos)
    search.advance(step([{2: -0.1, 7: -0.5, 8: -2.0}]))
    assert [b.output_token_ids for b in search.beams] == ([[2], [7]] if ignore_eos else [[7], [8]])
    assert [b.output_token_ids for b in search.finished] == ([] if ignore_eos else [[2]])
    search.advance(step([{9: -3.0}, {9: -0.2}]))
    result = search.result(None).sequences
    if ignore_eos:
        assert [b.output_token_ids for b in result] == [[7, 9], [2, 9]]
    else:  # the finished [2] (-0.1 over 2 tokens) beats [8, 9] (-2.2 over 4), which beats [7, 9] (-3.5)
        assert [(b.output_token_ids, b.finish_reason) for b in result] == [([2], "stop"), ([8, 9], "length")]


def test_length_penalty_divides_by_the_length_without_eos():
    eos = frozenset({2})
    beam = BeamSearchSequence([1, 5, 6, 2], 2, cum_logprob=-3.0)
    assert beam_score(beam, eos, 1.0) == pytest.approx(-1.0)
    assert beam_score(beam, eos, 0.0) == pytest.approx(-3.0)
    assert beam_score(BeamSearchSequence([1, 5, 6, 7], 2, cum_logprob=-3.0), eos, 2.0) == pytest.approx(-3.0 / 16)
