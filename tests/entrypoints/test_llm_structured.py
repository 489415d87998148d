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


def test_a_constraint_waits_for_the_think_block_to_end(llm):
    """Markers stand for a reasoning model's think tags: a newline opens the block and a tab
    closes it (neither can appear in compact JSON). Biased to write them, the model opens the
    block while the mask allows the grammar's tokens and the start marker, reasons unmasked,
    closes it, and only then does the grammar hold."""
    tokenizer = llm.get_tokenizer()
    start, end = ([tokenizer.convert_tokens_to_ids(byte)] for byte in ("<0x0A>", "<0x09>"))  # Llama 2's byte tokens
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["a"], "additionalProperties": False}
    markers = {"reasoning_start_id": start[0], "reasoning_end_id": end[0]}
    params = SamplingParams(temperature=0.0, max_tokens=40, logit_bias={start[0]: 40.0, end[0]: 50.0},
                            structured_outputs=constrained(json=schema, **markers))
    output = llm.generate([PROMPTS[0]], params)[0].outputs[0]
    assert output.token_ids[:2] == [start[0], end[0]] and output.finish_reason == "stop"
    assert json.loads(tokenizer.decode(output.token_ids[2:], skip_special_tokens=True)) in ({"a": n} for n in range(10))
    # Without the markers the same bias cannot open a block: the grammar holds from the first token.
    plain = SamplingParams(temperature=0.0, max_tokens=40, logit_bias={start[0]: 40.0, end[0]: 50.0},
                           structured_outputs=constrained(json=schema))
    assert json.loads(llm.generate([PROMPTS[0]], plain)[0].outputs[0].text) in ({"a": n} for n in range(10))


def test_a_prompt_that_opened_the_block_starts_in_it():
    from octavo.core.structured_output.manager import _first_phase

    params = constrained(json_object=True, reasoning_start_id=7, reasoning_end_id=8)
    assert _first_phase(params, [1, 7, 5]) == "reasoning"  # the template opened it
    assert _first_phase(params, [1, 7, 5, 8]) == "undecided"  # closed (thinking off): the model may still open one
    assert _first_phase(params, [1, 5]) == "undecided"
    deepseek = constrained(json_object=True, reasoning_start_id=7, reasoning_end_id=8, starts_in_reasoning=True)
    assert _first_phase(deepseek, [1, 5]) == "reasoning"
    with pytest.raises(Exception):
        constrained(json_object=True, reasoning_start_id=7)


TAGGED = {
    "type": "structural_tag",
    "format": {"type": "sequence", "elements": [
        {"type": "tag", "begin": "<code>", "content": {"type": "regex", "pattern": REGEX}, "end": "</code>"},
        {"type": "tag", "begin": "<answer>", "content": {"type": "regex", "pattern": r"(yes|no) \d{2}"}, "end": "</answer>"},
    ]},
}


def test_structural_tags(llm):
    """xgrammar's structural tag: the whole output two tags whose contents follow
    their patterns; vLLM's older shape (structures and triggers) compiles too and
    leaves free text around its tags, a schema inside them checked; a schema
    keyword the grammar cannot enforce inside a tag is refused like anywhere else."""
    params = SamplingParams(temperature=0.0, max_tokens=180, structured_outputs=constrained(structural_tag=TAGGED))
    for output in llm.generate(PROMPTS[:2], params):
        text, reason = output.outputs[0].text, output.outputs[0].finish_reason
        match = re.fullmatch(r"<code>(.*)</code><answer>(.*)</answer>", text, re.DOTALL)
        assert reason == "stop" and match, text
        assert re.fullmatch(REGEX, match.group(1)) and re.fullmatch(r"(yes|no) \d{2}", match.group(2))
    legacy = constrained(structural_tag=json.dumps({
        "type": "structural_tag", "triggers": ["<function="],
        "structures": [{"begin": "<function=person>", "schema": PERSON, "end": "</function>"}],
    }))
    assert legacy.structural_tag["format"]["type"] == "triggered_tags"
    texts = [o.outputs[0].text for o in llm.generate(PROMPTS, SamplingParams(temperature=1.0, seed=5, max_tokens=30, structured_outputs=legacy))]
    assert all(texts)
    for text in texts:
        for call in re.findall(r"<function=person>(.*?)</function>", text, re.DOTALL):
            check_json(call)
    bad = constrained(structural_tag={"type": "structural_tag", "format": {"type": "tag", "begin": "<a>", "end": "</a>",
        "content": {"type": "json_schema", "json_schema": {"type": "array", "uniqueItems": True}}}})
    with pytest.raises(Exception, match="uniqueItems"):
        llm.generate(PROMPTS[:1], SamplingParams(max_tokens=4, structured_outputs=bad))
    for value, message in [({"type": "json"}, "structural_tag"), ({"type": "structural_tag"}, "needs"), ("{", "not valid JSON")]:
        with pytest.raises(Exception, match=message):
            constrained(structural_tag=value)
