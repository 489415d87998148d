"""Structured outputs through the Python API, on random weights: the grammar
alone makes every output valid, with n > 1, under preemption (a KV cache too
small for the batch), and with decode overlap (masks applied to logits that
were computed before the host had the previous token)."""

from __future__ import annotations

import json
import re

import pytest

from octavo import SamplingParams, StructuredOutputsParams

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pet": {"enum": ["cat", "dog", None]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
    },
    "required": ["name", "age", "pet"],
}
REGEX = r"[a-z]{2,5}-\d{3}"
CHOICES = ["red", "green", "blue sky"]
GRAMMAR = 'root ::= "(" expr ")"\nexpr ::= digit | digit ("+" | "*") expr\ndigit ::= [0-9]'
# ~40 tokens each: 8 sequences cannot all hold their blocks at once.
PROMPTS = [f"{words} " * 6 for words in ("Describe a person:", "Who is there?", "Tell me about your friend", "A JSON object")]


@pytest.fixture(scope="module")
def llm(chat_model_dir):
    from octavo import LLM

    # 224 tokens of KV cache for 8 sequences of 40-100 tokens: preemption is certain.
    llm = LLM(str(chat_model_dir), dtype="float32", max_model_len=512, block_size=4, num_kv_blocks=56, overlap_decode=False)
    yield llm
    llm.engine.shutdown()


def constrained(**fields) -> StructuredOutputsParams:
    return StructuredOutputsParams(**fields)


def check_json(text: str) -> None:
    jsonschema.validate(json.loads(text), PERSON)


def test_every_output_matches_its_constraint_with_n_and_preemption(llm):
    preemptions_before = llm.engine.get_stats().num_preemptions
    cases = [
        (SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=160, structured_outputs=constrained(json=PERSON)), check_json),
        (SamplingParams(n=2, temperature=0.9, max_tokens=40, structured_outputs=constrained(regex=REGEX)),
         lambda text: re.fullmatch(REGEX, text) or pytest.fail(text)),
        (SamplingParams(n=2, temperature=1.0, max_tokens=40, structured_outputs=constrained(choice=CHOICES)),
         lambda text: text in CHOICES or pytest.fail(text)),
        (SamplingParams(temperature=0, max_tokens=60, structured_outputs=constrained(grammar=GRAMMAR)),
         lambda text: re.fullmatch(r"\((\d[+*])*\d\)", text) or pytest.fail(text)),
    ]
    outputs = llm.generate(PROMPTS, [params for params, _ in cases])
    for output, (params, check) in zip(outputs, cases):
        assert len(output.outputs) == params.n
        for completion in output.outputs:
            assert completion.finish_reason == "stop", completion
            check(completion.text)
    assert llm.engine.get_stats().num_preemptions > preemptions_before


def test_a_bad_constraint_is_refused_before_anything_is_queued(llm):
    from octavo.errors import StructuredOutputError

    with pytest.raises(StructuredOutputError, match="regex does not compile"):
        llm.generate(PROMPTS[:2], [SamplingParams(), SamplingParams(structured_outputs=constrained(regex="[a-"))])
    assert not llm.engine.has_unfinished_requests()


def test_decode_overlap_gives_the_same_constrained_tokens(chat_model_dir, make_llm, llm):
    params = [
        SamplingParams(temperature=0, max_tokens=120, structured_outputs=constrained(json=PERSON)),
        SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),  # unconstrained, in the same batches
        SamplingParams(temperature=0, max_tokens=40, structured_outputs=constrained(regex=REGEX)),
    ]
    prompts = PROMPTS[:3]
    plain = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    overlapped_llm = make_llm(chat_model_dir, max_model_len=512, overlap_decode=True)
    overlap = overlapped_llm.engine.executor.worker.runner.overlap
    overlapped = [o.outputs[0].token_ids for o in overlapped_llm.generate(prompts, params)]
    assert overlapped == plain
    assert overlap.num_reused > 10
    check_json(overlapped_llm.get_tokenizer().decode(overlapped[0], skip_special_tokens=True))
