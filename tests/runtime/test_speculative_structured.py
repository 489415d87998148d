"""Speculative decoding under structured-output grammars (random weights,
the real Llama 2 tokenizer): drafts stop where the grammar would refuse
one, each drafted place is masked as the grammar stands there, so greedy
outputs are the plain engine's and random ones stay valid; with the target
as its own draft model every scheduled draft is accepted."""

from __future__ import annotations

import json

import pytest

from octavo import SamplingParams, StructuredOutputsParams
from tests.entrypoints.test_llm_structured import GRAMMAR, PERSON, PROMPTS, REGEX

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2, "prompt_lookup_min": 1}


def cases() -> list[SamplingParams]:
    kinds = [dict(json=PERSON), dict(json_object=True), dict(regex=REGEX), dict(grammar=GRAMMAR)]
    return [
        SamplingParams(temperature=0.0, max_tokens=60, structured_outputs=StructuredOutputsParams(**kind), logprobs=1)
        for kind in kinds
    ]


def generate(llm, params):
    outputs = llm.generate(PROMPTS, params)
    return [(o.outputs[0].token_ids, o.outputs[0].text, [sorted(e) for e in o.outputs[0].logprobs]) for o in outputs]


@pytest.fixture(scope="module")
def plain(chat_model_dir):
    from octavo import LLM

    llm = LLM(str(chat_model_dir), dtype="float32", max_model_len=512, overlap_decode=False)
    outputs = generate(llm, cases())
    llm.engine.shutdown()
    return outputs


@pytest.mark.parametrize("speculative", ["ngram", "draft_model", "eagle3"])
def test_constrained_outputs_are_the_plain_engines(chat_model_dir, make_llm, plain, speculative, tmp_path):
    config = NGRAM if speculative == "ngram" else {"model": str(chat_model_dir), "num_speculative_tokens": 3}
    if speculative == "eagle3":  # a head that guesses the newest token again: JSON's repeats are accepted
        from tests.runtime.eagle_reference import build_eagle3_head

        head = build_eagle3_head(tmp_path / "eagle3", chat_model_dir, repeats=True)
        config = {"method": "eagle3", "model": str(head), "num_speculative_tokens": 3}
    llm = make_llm(chat_model_dir, max_model_len=512, speculative_config=config)
    got = generate(llm, cases())
    assert [g[:2] for g in got] == [p[:2] for p in plain]
    assert [g[2] for g in got] == [p[2] for p in plain]  # the logprobs' token ids
    jsonschema.validate(json.loads(got[0][1]), PERSON)
    stats = llm.engine.get_stats().spec_decoding
    assert stats.num_accepted_tokens > 0
    if speculative == "draft_model":  # the grammar-valid guesses of the target itself
        assert stats.num_accepted_tokens == stats.num_draft_tokens


def test_random_constrained_requests_stay_valid(chat_model_dir, make_llm):
    llm = make_llm(chat_model_dir, max_model_len=512, speculative_config=NGRAM)
    params = SamplingParams(n=3, temperature=0.8, max_tokens=160, structured_outputs=StructuredOutputsParams(json=PERSON))
    for output in llm.generate(PROMPTS, params):
        for completion in output.outputs:
            jsonschema.validate(json.loads(completion.text), PERSON)
    assert llm.engine.get_stats().spec_decoding.num_drafts > 0


@pytest.mark.parametrize("speculative", ["ngram", "draft_model"])
def test_drafts_move_through_think_blocks(chat_model_dir, make_llm, speculative):
    """Markers stand for a reasoning model's think tags (a newline opens,
    a tab closes, as in tests/entrypoints/test_llm_structured.py): a request
    that starts inside the block reasons unmasked with drafts, and one biased
    to open and close it drafts across both markers into the grammar; the
    tokens are the plain engine's."""
    from octavo import LLM

    plain = LLM(str(chat_model_dir), dtype="float32", max_model_len=512, overlap_decode=False)
    tokenizer = plain.get_tokenizer()
    start, end = (tokenizer.convert_tokens_to_ids(byte) for byte in ("<0x0A>", "<0x09>"))
    markers = {"reasoning_start_id": start, "reasoning_end_id": end}
    params = [
        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True,
                       structured_outputs=StructuredOutputsParams(json_object=True, starts_in_reasoning=True, **markers)),
        SamplingParams(temperature=0.0, max_tokens=40, logit_bias={start: 40.0, end: 50.0},
                       structured_outputs=StructuredOutputsParams(json=PERSON, **markers)),
    ]
    expected = [(o.outputs[0].token_ids, o.outputs[0].text) for o in plain.generate(PROMPTS[:2], params)]
    plain.engine.shutdown()
    config = NGRAM if speculative == "ngram" else {"model": str(chat_model_dir), "num_speculative_tokens": 3}
    llm = make_llm(chat_model_dir, max_model_len=512, speculative_config=config)
    got = [(o.outputs[0].token_ids, o.outputs[0].text) for o in llm.generate(PROMPTS[:2], params)]
    assert got == expected
    assert got[1][0][:2] == [start, end]  # the second opened and closed its block
    assert llm.engine.get_stats().spec_decoding.num_draft_tokens > 0
