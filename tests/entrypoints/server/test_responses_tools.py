"""Tools, reasoning and structured output on the Responses API, through the
openai client on the chat server (random weights, the real Llama 2 tokenizer,
hermes tool parser, qwen3 reasoning parser). As in
``test_tools_and_reasoning.py``, ``required`` and named tool choices are
enforced by grammar, and a regex pins what a random model writes where a
parser must read it."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, Field

from tests.entrypoints.server.conftest import CHAT_MODEL_NAME
from tests.entrypoints.server.test_tools_and_reasoning import HERMES_CALL, SCHEMAS, THINKING, TIME, TOOLS, WEATHER

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")

# The Responses API's flat function tools.
FLAT_TOOLS = [{"type": "function", "name": t["function"]["name"], "description": t["function"].get("description"),
               "parameters": t["function"]["parameters"]} for t in TOOLS]
QUESTION = "What is the weather in Paris?"


def respond(client, **kwargs):
    kwargs.setdefault("max_output_tokens", 200)
    kwargs.setdefault("temperature", 0)
    return client.responses.create(model=CHAT_MODEL_NAME, input=QUESTION, tools=FLAT_TOOLS, **kwargs)


def calls_of(response) -> list:
    return [item for item in response.output if item.type == "function_call"]


@pytest.mark.parametrize("parallel", [True, False])
def test_required_calls_are_function_call_items(chat_openai, parallel):
    response = respond(chat_openai, tool_choice="required", parallel_tool_calls=parallel, temperature=1.0,
                       extra_body={"seed": 3})
    calls = calls_of(response)
    assert calls and response.status == "completed" and (parallel or len(calls) == 1)
    for call in calls:
        assert call.id.startswith("fc_") and call.call_id.startswith("call_") and call.status == "completed"
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])


def test_max_tool_calls_keeps_the_first(chat_openai):
    response = respond(chat_openai, tool_choice="required", max_tool_calls=1, temperature=1.0, extra_body={"seed": 5})
    assert len(calls_of(response)) == 1


def test_streamed_named_call_and_its_result_round_trip(chat_openai):
    with chat_openai.responses.stream(
        model=CHAT_MODEL_NAME, input=QUESTION, tools=FLAT_TOOLS, tool_choice={"type": "function", "name": "get_time"},
        max_output_tokens=200, temperature=0,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    (call,) = calls_of(final)
    assert call.name == "get_time" and len(pieces) > 1 and "".join(pieces) == call.arguments
    jsonschema.validate(json.loads(call.arguments), TIME)
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done.arguments == call.arguments
    # The tool's result goes back as a function_call_output after the stored response.
    follow = chat_openai.responses.create(
        model=CHAT_MODEL_NAME, previous_response_id=final.id, tools=FLAT_TOOLS, tool_choice="none",
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "12:00"}],
        max_output_tokens=4, temperature=0,
    )
    assert follow.output[0].type == "message" and follow.usage.input_tokens > final.usage.input_tokens


def test_auto_reads_hermes_calls(chat_openai):
    response = respond(chat_openai, tool_choice="auto", extra_body={"structured_outputs": {"regex": HERMES_CALL}})
    assert [item.type for item in response.output] == ["message", "function_call"]
    assert response.output_text == "Let me look."
    jsonschema.validate(json.loads(calls_of(response)[0].arguments), WEATHER)


def test_reasoning_items_streamed_and_whole(chat_openai):
    kwargs = dict(model=CHAT_MODEL_NAME, input=QUESTION, max_output_tokens=60, temperature=0,
                  extra_body={"structured_outputs": {"regex": THINKING}})
    whole = chat_openai.responses.create(**kwargs)
    assert [item.type for item in whole.output] == ["reasoning", "message"]
    reasoning = whole.output[0].content[0].text
    assert reasoning.strip() and "<think>" not in reasoning and whole.usage.output_tokens_details.reasoning_tokens > 0
    with chat_openai.responses.stream(**kwargs) as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert deltas == reasoning and final.output_text == whole.output_text
    # The reasoning item sent back renders as the assistant turn's reasoning.
    again = chat_openai.responses.create(
        model=CHAT_MODEL_NAME, max_output_tokens=4, temperature=0,
        input=[{"role": "user", "content": QUESTION}, *[item.model_dump(exclude_none=True) for item in whole.output],
               {"role": "user", "content": "Thanks."}],
    )
    assert again.status in ("completed", "incomplete")


class Forecast(BaseModel):
    city: str = Field(max_length=8)  # bounded, so that a random model finishes it
    days: int = Field(ge=1, le=9)


def test_text_format_json_schema_parses(chat_openai):
    response = chat_openai.responses.parse(
        model=CHAT_MODEL_NAME, input=QUESTION, text_format=Forecast, max_output_tokens=200, temperature=0
    )
    assert isinstance(response.output_parsed, Forecast)
    assert response.text.format.type == "json_schema"
