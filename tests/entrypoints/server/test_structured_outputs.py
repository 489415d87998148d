"""Structured outputs through a real ``octavo serve`` and real clients, on
random weights: only the grammar makes the outputs valid, so every one is
parsed and validated (jsonschema), with n > 1 and under preemption; bad
constraints are 400s naming the field and the reason, and the server keeps
serving."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import openai
import pytest
from pydantic import BaseModel, Field

from tests.entrypoints.server.conftest import CHAT_MODEL_NAME, read_metrics
from tests.entrypoints.test_llm_structured import PERSON

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")

WORDS = {
    "type": "object",
    "properties": {"words": {"type": "array", "items": {"type": "string", "minLength": 4, "maxLength": 8}, "minItems": 10, "maxItems": 10}},
    "required": ["words"],
}
MESSAGES = [{"role": "user", "content": "Describe someone."}]


class Person(BaseModel):
    name: str = Field(max_length=6)
    age: int = Field(ge=0, le=99)
    retired: bool


def create(client, **kwargs):
    kwargs.setdefault("max_tokens", 200)
    return client.chat.completions.create(model=CHAT_MODEL_NAME, messages=MESSAGES, **kwargs)


def test_parse_with_a_pydantic_model(chat_openai):
    completion = chat_openai.chat.completions.parse(
        model=CHAT_MODEL_NAME, messages=MESSAGES, response_format=Person, max_tokens=200, temperature=0
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Person)


def test_json_schema_with_n_under_preemption(chat_server):
    """Two requests of n=4 at once: 8 sequences of ~110 tokens overflow the
    768-token KV cache while they run."""
    client = openai.AsyncOpenAI(base_url=f"{chat_server.url}/v1", api_key="unused", max_retries=0, timeout=120)
    response_format = {"type": "json_schema", "json_schema": {"name": "words", "schema": WORDS, "strict": True}}
    before = read_metrics(chat_server).get("octavo:num_preemptions_total", 0)

    async def main():
        async with client:
            jobs = [
                client.chat.completions.create(
                    model=CHAT_MODEL_NAME, messages=[{"role": "user", "content": f"{seed}: ten words " * 8}],
                    max_tokens=200, n=4, temperature=1.0, seed=seed, response_format=response_format,
                )
                for seed in (1, 2)
            ]
            return await asyncio.gather(*jobs)

    for completion in asyncio.run(main()):
        assert len(completion.choices) == 4
        for choice in completion.choices:
            assert choice.finish_reason == "stop"
            jsonschema.validate(json.loads(choice.message.content), WORDS)
    assert read_metrics(chat_server)["octavo:num_preemptions_total"] > before


@pytest.mark.parametrize(
    "extra, check",
    [
        ({"structured_outputs": {"regex": r"[a-z]{2,4}-\d{3}"}}, lambda text: re.fullmatch(r"[a-z]{2,4}-\d{3}", text)),
        ({"guided_regex": r"\d{4}"}, lambda text: re.fullmatch(r"\d{4}", text)),
        ({"structured_outputs": {"choice": ["alpha", "beta gamma"]}}, lambda text: text in ("alpha", "beta gamma")),
        ({"guided_choice": ["yes", "no"]}, lambda text: text in ("yes", "no")),
        ({"structured_outputs": {"grammar": 'root ::= "(" [0-9] ("+" [0-9])* ")"'}},
         lambda text: re.fullmatch(r"\(\d(\+\d)*\)", text)),
        ({"guided_json": PERSON}, lambda text: jsonschema.validate(json.loads(text), PERSON) is None),
        ({"response_format": {"type": "structural_tag", "format": {
            "type": "tag", "begin": "<p>", "content": {"type": "regex", "pattern": r"[a-z]{2,4}-\d{3}"}, "end": "</p>"}}},
         lambda text: re.fullmatch(r"<p>[a-z]{2,4}-\d{3}</p>", text)),
    ],
)
def test_vllm_constraint_fields_on_chat_and_completions(chat_openai, extra, check):
    chat = create(chat_openai, n=2, temperature=1.0, extra_body=extra)
    completion = chat_openai.completions.create(
        model=CHAT_MODEL_NAME, prompt="Answer:", max_tokens=200, temperature=0, extra_body=extra
    )
    texts = [c.message.content for c in chat.choices] + [completion.choices[0].text]
    for text, choice in zip(texts, [*chat.choices, completion.choices[0]]):
        assert choice.finish_reason == "stop" and check(text), text


def test_streamed_json_schema_on_completions(chat_openai):
    stream = chat_openai.completions.create(
        model=CHAT_MODEL_NAME, prompt="Person:", max_tokens=200, temperature=0, stream=True,
        extra_body={"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}},
    )
    text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    jsonschema.validate(json.loads(text), PERSON)


def bad_request(chat_server, path: str, body: dict) -> dict:
    response = httpx.post(f"{chat_server.url}{path}", json={"model": CHAT_MODEL_NAME, "max_tokens": 20, **body}, timeout=60)
    assert response.status_code == 400, response.text
    return response.json()["error"]


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
         "response_format.json_schema.schema", "invalid JSON schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}}}},
         "response_format.json_schema.schema", "'uniqueItems' is not supported"),
        ({"structured_outputs": {"regex": "[a-"}}, "structured_outputs", "regex does not compile"),
        ({"guided_grammar": "root ::= nothing"}, "guided_grammar", 'Rule "nothing" is not defined'),
        ({"guided_choice": [f"option{i}" for i in range(3000)]}, "guided_choice", "compiled choice grammar takes"),
        ({"guided_regex": "a" * 140_000}, "guided_regex", "more than the limit"),
        ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex", "not response_format and guided_regex"),
        ({"response_format": {"type": "structural_tag"}}, "response_format", "needs \"format\""),
        ({"response_format": {"type": "xml"}}, "response_format.type", "not supported"),
        # Nesting past Python's recursion limit, as JSON text: once a 500 (RecursionError).
        ({"structured_outputs": {"json": "[" * 3000}}, "structured_outputs.json", "nested too deeply"),
        ({"guided_json": "[" * 3000 + "]" * 3000}, "guided_json", "nested more than 128 levels"),
        ({"structured_outputs": {"structural_tag": '{"format": ' + '{"a": ' * 200 + "1" + "}" * 201}},
         "structured_outputs", "nested more than 128 levels"),
        ({"logit_bias": {"1.5": 5}}, "logit_bias", "must be token ids"),
        ({"reasoning_effort": "high"}, "reasoning_effort", "not supported"),
        ({"best_of_n_magic": 3}, "best_of_n_magic", "could change the output"),
    ],
)
def test_bad_constraints_are_400s_and_the_server_goes_on(chat_server, chat_openai, body, param, words):
    error = bad_request(chat_server, "/v1/chat/completions", {"messages": MESSAGES, **body})
    assert error["param"] == param and re.search(words, error["message"]), error
    assert create(chat_openai, max_tokens=4).choices[0].finish_reason == "length"
