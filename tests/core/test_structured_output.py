"""Structured-output core: constraint shapes, the JSON-schema gate, the
compiler's limits and cache, and the token mask applied on the device."""

from __future__ import annotations

import pytest

from octavo.core.structured_output.compiler import GrammarCompiler, StructuredOutputLimits
from octavo.core.structured_output.params import StructuredOutputsParams
from octavo.core.structured_output.schema_check import check_json_schema
from octavo.errors import (
    GrammarTimeoutError,
    GrammarTooLargeError,
    InvalidSamplingParamsError,
    StructuredOutputError,
)

xgr = pytest.importorskip("xgrammar")


@pytest.fixture(scope="module")
def tokenizer(llama2_tokenizer_dir):
    from octavo.core.tokenizer import load_tokenizer

    return load_tokenizer(llama2_tokenizer_dir)


@pytest.fixture(scope="module")
def compiler(tokenizer):
    compiler = GrammarCompiler(tokenizer, 32000, frozenset({2}))
    yield compiler
    compiler.shutdown()


@pytest.mark.parametrize(
    "fields",
    [{}, {"json": {"type": "object"}, "regex": "a"}, {"choice": []}, {"choice": ["a", 1]}, {"regex": ""}, {"json": "{"}],
)
def test_a_constraint_has_exactly_one_valid_kind(fields):
    with pytest.raises(InvalidSamplingParamsError):
        StructuredOutputsParams(**fields)


def test_keys_keep_property_order():
    first = StructuredOutputsParams(json={"type": "object", "properties": {"b": {}, "a": {}}})
    second = StructuredOutputsParams(json='{"type": "object", "properties": {"a": {}, "b": {}}}')
    assert first.kind == "json" and first.key != second.key


@pytest.mark.parametrize(
    "schema, words",
    [
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"type": "object", "properties": {"x": {"not": {"type": "string"}}}}, "#/properties/x: keyword 'not'"),
        ({"type": "number", "multipleOf": 0.5}, "multipleOf"),
        ({"type": "string", "format": "credit-card"}, "format 'credit-card'"),
        ({"allOf": [{"type": "string"}, {"minLength": 2}]}, "allOf"),
        ({"type": "object", "maxProperties": 2}, "maxProperties"),
        ({"$ref": "https://example.com/schema.json"}, "local references"),
        ({"type": "string", "minLength": -1}, "invalid JSON schema at #/minLength"),
        ({"type": "strin"}, "invalid JSON schema"),
        ([1], "must be an object"),
    ],
)
def test_schemas_the_grammar_cannot_hold_are_refused(schema, words):
    with pytest.raises(StructuredOutputError, match=words.replace("(", r"\(")):
        check_json_schema(schema)


def test_supported_schemas_pass():
    check_json_schema(
        {
            "title": "Person", "type": "object", "additionalProperties": False, "x-vendor": 1,
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 8, "description": "d"},
                "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "maxItems": 3},
                "when": {"type": "string", "format": "date"},
                "n": {"type": "integer", "multipleOf": 3},
                "either": {"anyOf": [{"type": "null"}, {"enum": ["a", "b"]}]},
            },
            "$defs": {"tag": {"type": "string", "pattern": "^[a-z]+$"}},
            "required": ["name"],
        }
    )


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"regex": "a("}, "regex does not compile: Regex parsing error"),
        ({"grammar": "root ::= missing"}, 'grammar does not compile: .*Rule "missing" is not defined'),
        ({"json": {"type": "integer", "minimum": 5, "maximum": 1}}, "JSON schema does not compile"),
    ],
)
def test_compile_errors_say_why(compiler, fields, words):
    with pytest.raises(StructuredOutputError, match=words):
        compiler.wait(compiler.submit(StructuredOutputsParams(**fields)))


def test_jobs_and_failures_are_cached(compiler):
    params = StructuredOutputsParams(choice=["yes", "no"])
    job = compiler.submit(params)
    assert compiler.wait(job) is compiler.wait(compiler.submit(StructuredOutputsParams(choice=["yes", "no"])))
    bad = compiler.submit(StructuredOutputsParams(regex="(("))
    assert compiler.submit(StructuredOutputsParams(regex="((")) is bad
    with pytest.raises(StructuredOutputError):
        compiler.wait(bad)
    assert compiler.check(bad) is not None and compiler.check(job) is None


@pytest.fixture
def limited(compiler):
    """The shared compiler with other limits for one test (and an empty cache)."""
    saved = compiler.limits

    def set_limits(**limits):
        compiler.limits = StructuredOutputLimits(**limits)
        compiler._jobs.clear()
        return compiler

    yield set_limits
    compiler.limits = saved
    compiler._jobs.clear()


def test_size_limits(limited):
    small = limited(max_spec_chars=200, max_grammar_bytes=1_500)
    with pytest.raises(GrammarTooLargeError, match="more than the limit of 200"):
        small.wait(small.submit(StructuredOutputsParams(regex="a" * 201)))
    many = StructuredOutputsParams(choice=[f"c{i}" for i in range(20)])
    with pytest.raises(GrammarTooLargeError, match="compiled choice grammar takes"):
        small.wait(small.submit(many))


def test_time_limit(limited):
    slow = limited(compile_timeout_s=0.01)
    params = StructuredOutputsParams(regex="[a-z]{1,2000}")  # ~0.4 s to compile
    job = slow.submit(params)
    with pytest.raises(GrammarTimeoutError, match="longer than the limit of 0.01 s"):
        slow.wait(job)
    job.future.result(timeout=60)  # the thread finishes: the grammar is there, and how long it took
    with pytest.raises(GrammarTimeoutError):  # so a front end refuses it again, at once
        slow.wait(slow.submit(params))
    assert slow.check(job) is None  # the engine, which compiles what front ends accepted, is not held to it


def test_the_server_awaits_the_time_limit_and_names_the_field(limited):
    # The server's path (an event loop that keeps serving): the typed 400 names
    # the request field. Here and not against a live server, whose limit must
    # let ordinary schemas through: there, which limit a slow constraint meets
    # first (time or size) would depend on the machine's speed.
    import asyncio
    from types import SimpleNamespace

    from octavo import SamplingParams
    from octavo.entrypoints.openai.structured import check_constraint

    slow = limited(compile_timeout_s=0.01)
    params = SamplingParams(structured_outputs=StructuredOutputsParams(regex="[a-z]{1,1999}"))  # ~0.4 s
    with pytest.raises(GrammarTimeoutError, match="longer than the limit of 0.01 s") as caught:
        asyncio.run(check_constraint(SimpleNamespace(grammar_compiler=slow), params, "guided_regex"))
    assert caught.value.param == "guided_regex"


def test_bitmask_on_the_device_matches_xgrammar():
    import torch

    from octavo.runtime.sampler import AllowedTokens, apply_token_bitmask_

    generator = torch.Generator().manual_seed(0)
    vocab_size = 1000
    words = torch.randint(-(2**31), 2**31 - 1, (3, xgr.get_bitmask_shape(1, vocab_size)[1]), dtype=torch.int32, generator=generator)
    logits = torch.randn(5, vocab_size, generator=generator)
    expected = logits.clone()
    full = torch.zeros(5, words.shape[1], dtype=torch.int32)  # xgrammar's rows line up with the logits'
    full[[4, 0, 2]] = words
    xgr.apply_token_bitmask_inplace(expected, full, indices=[4, 0, 2])
    apply_token_bitmask_(logits, AllowedTokens(words, torch.tensor([4, 0, 2])))
    assert torch.equal(logits, expected)


def test_length_limited_strings_stay_valid_json(compiler):
    """xgrammar alone lets control characters into strings with min/maxLength."""
    schema = {"type": "object", "properties": {"s": {"type": "string", "minLength": 2, "maxLength": 3}}, "required": ["s"]}
    compiled = compiler.wait(compiler.submit(StructuredOutputsParams(json=schema)))

    def accepts(text: str) -> bool:
        matcher = xgr.GrammarMatcher(compiled)
        return matcher.accept_string(text) and matcher.is_completed()

    assert accepts('{"s": "abc"}') and not accepts('{"s": "a"}') and not accepts('{"s": "abcd"}')
    assert not accepts('{"s": "a\\x0fb"}'.replace("\\x0f", "\x0f"))
    with pytest.raises(StructuredOutputError, match="cannot be combined with pattern"):
        check_json_schema({"type": "string", "pattern": "^a+$", "maxLength": 3})


def test_bitmask_on_every_row_in_order():
    import torch

    from octavo.runtime.sampler import AllowedTokens, apply_token_bitmask_

    generator = torch.Generator().manual_seed(1)
    words = torch.randint(-(2**31), 2**31 - 1, (3, 4), dtype=torch.int32, generator=generator)
    logits = torch.randn(3, 100, generator=generator)  # narrower than the mask's 128 bits
    expected = logits.clone()
    xgr.apply_token_bitmask_inplace(expected, words, vocab_size=100)
    assert torch.equal(apply_token_bitmask_(logits, AllowedTokens(words, None)), expected)
