"""Tool calling and reasoning through a real ``octavo serve`` and real
clients (openai, langchain-openai, anthropic), on random weights.

``required`` and named tool choices are enforced by grammar, so their
arguments always parse and validate. ``auto`` goes through the hermes parser;
to make a random model write a ``<tool_call>`` block (and ``<think>``
reasoning for the qwen3 parser), those tests pin the text with a regex
constraint, which the parsers then read like any model's output."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.entrypoints.server.conftest import CHAT_MODEL_NAME

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": "integer", "minimum": 1, "maximum": 9}},
    "required": ["city", "days"],
}
TIME = {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The forecast", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
# What a Hermes model writes to call get_weather; pinned on the random model with a regex.
HERMES_CALL = r'Let me look\.<tool_call>\{"name": "get_weather", "arguments": \{"city": "[a-z]{2,6}", "days": [1-9]\}\}</tool_call>'
THINKING = r"<think>(yes|no|maybe) (so|then)</think>\n\n(Fine|Good)\."


def check_calls(tool_calls, names=None) -> None:
    assert tool_calls
    for call in tool_calls:
        assert call.id and call.type == "function"
        assert names is None or call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def chat(client, **kwargs):
    kwargs.setdefault("max_tokens", 200)
    kwargs.setdefault("temperature", 0)
    return client.chat.completions.create(model=CHAT_MODEL_NAME, messages=MESSAGES, tools=TOOLS, **kwargs)


@pytest.mark.parametrize("parallel", [True, False])
def test_required_calls_always_parse_and_validate(chat_openai, parallel):
    completion = chat(chat_openai, tool_choice="required", n=2, temperature=1.0, seed=3, parallel_tool_calls=parallel)
    for choice in completion.choices:
        assert choice.finish_reason == "tool_calls"
        check_calls(choice.message.tool_calls)
        assert parallel or len(choice.message.tool_calls) == 1


def test_named_choice_calls_that_function(chat_openai):
    choice = chat(chat_openai, tool_choice={"type": "function", "function": {"name": "get_time"}}).choices[0]
    assert choice.finish_reason == "tool_calls"
    check_calls(choice.message.tool_calls, names={"get_time"})
    assert len(choice.message.tool_calls) == 1


def test_none_and_auto_without_a_call_answer_in_text(chat_openai):
    for tool_choice in ("none", "auto"):
        choice = chat(chat_openai, tool_choice=tool_choice, max_tokens=8).choices[0]
        assert choice.message.tool_calls is None and choice.message.content and choice.finish_reason == "length"


def test_auto_reads_hermes_calls_streamed_and_not(chat_openai):
    extra = {"structured_outputs": {"regex": HERMES_CALL}}
    message = chat(chat_openai, tool_choice="auto", extra_body=extra).choices[0].message
    assert message.content == "Let me look."
    check_calls(message.tool_calls, names={"get_weather"})
    stream = chat(chat_openai, tool_choice="auto", extra_body=extra, stream=True)
    content, calls, finish = "", {}, None
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            if call.id:  # the first delta of a call names it
                calls[call.index] = [call.id, call.function.name, call.function.arguments or ""]
            else:
                assert call.function.name is None
                calls[call.index][2] += call.function.arguments
        finish = chunk.choices[0].finish_reason or finish
    assert content == "Let me look." and finish == "tool_calls"
    assert [(name, json.loads(args)) for _, name, args in calls.values()] == [
        (c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls
    ]


def test_streamed_required_call_deltas(chat_openai):
    stream = chat(chat_openai, tool_choice="required", parallel_tool_calls=False, stream=True)
    pieces = [call for chunk in stream if chunk.choices for call in chunk.choices[0].delta.tool_calls or []]
    assert pieces[0].id and pieces[0].type == "function" and pieces[0].function.name in SCHEMAS
    assert len(pieces) > 2 and all(p.id is None and p.index == 0 for p in pieces[1:])
    arguments = "".join(p.function.arguments or "" for p in pieces)
    jsonschema.validate(json.loads(arguments), SCHEMAS[pieces[0].function.name])


def test_tool_history_reaches_the_template(chat_openai):
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'}}
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
    ]
    plain = chat_openai.chat.completions.create(model=CHAT_MODEL_NAME, messages=MESSAGES, max_tokens=1)
    completion = chat_openai.chat.completions.create(
        model=CHAT_MODEL_NAME, messages=history, tools=TOOLS, tool_choice="none", max_tokens=1
    )
    # The tools, the call and its result are all in the prompt.
    assert completion.usage.prompt_tokens > plain.usage.prompt_tokens + 100


def test_missing_tool_and_bad_tools_are_400s(chat_server):
    cases = [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "not among the tools"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools.0.name", "tool name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "not": {}}}}],
          "tool_choice": "required"}, "tools.0.parameters", "'not' is not supported"),
        ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format", "cannot be combined"),
        ({"tool_choice": "required", "tools": []}, "tool_choice", "needs tools"),
        ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs", "may not set tokenize"),
    ]
    for body, param, words in cases:
        request = {"model": CHAT_MODEL_NAME, "messages": MESSAGES, "tools": TOOLS, "max_tokens": 5, **body}
        response = httpx.post(f"{chat_server.url}/v1/chat/completions", json=request, timeout=60)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param and words in error["message"], error


def test_reasoning_content_and_template_switch(chat_openai):
    extra = {"structured_outputs": {"regex": THINKING}}
    message = chat_openai.chat.completions.create(
        model=CHAT_MODEL_NAME, messages=MESSAGES, max_tokens=60, temperature=0, extra_body=extra
    ).choices[0].message
    assert message.reasoning_content and message.content and "<think>" not in message.content
    stream = chat_openai.chat.completions.create(
        model=CHAT_MODEL_NAME, messages=MESSAGES, max_tokens=60, temperature=0, extra_body=extra, stream=True
    )
    deltas = [chunk.choices[0].delta for chunk in stream if chunk.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == message.reasoning_content
    assert "".join(d.content or "" for d in deltas) == message.content
    thinking_off = chat_openai.chat.completions.create(
        model=CHAT_MODEL_NAME, messages=MESSAGES, max_tokens=1, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
    )
    plain = chat_openai.chat.completions.create(model=CHAT_MODEL_NAME, messages=MESSAGES, max_tokens=1)
    assert thinking_off.usage.prompt_tokens > plain.usage.prompt_tokens  # the template wrote the empty <think> block


def test_langchain_bind_tools_and_structured_output(chat_server):
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    class Forecast(BaseModel):
        """A weather forecast."""

        city: str = Field(max_length=8)
        days: int = Field(ge=1, le=9)

    llm = ChatOpenAI(base_url=f"{chat_server.url}/v1", api_key="unused", model=CHAT_MODEL_NAME, temperature=0, max_tokens=120)
    message = llm.bind_tools(TOOLS, tool_choice="get_weather").invoke("Weather in Paris?")
    (call,) = message.tool_calls
    assert call["name"] == "get_weather"
    jsonschema.validate(call["args"], WEATHER)
    for method in ("json_schema", "function_calling"):
        forecast = llm.with_structured_output(Forecast, method=method).invoke("Forecast for Rome")
        assert isinstance(forecast, Forecast)


# ---------------------------------------------------------------- Anthropic

ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "description": "d", "input_schema": t["function"]["parameters"]} for t in TOOLS]


def test_anthropic_tool_use_blocks(chat_anthropic):
    message = chat_anthropic.messages.create(
        model=CHAT_MODEL_NAME, max_tokens=200, messages=MESSAGES, tools=ANTHROPIC_TOOLS,
        tool_choice={"type": "any", "disable_parallel_tool_use": True}, extra_body={"temperature": 0},
    )
    assert message.stop_reason == "tool_use"
    (block,) = [b for b in message.content if b.type == "tool_use"]
    assert block.id.startswith("toolu_")
    jsonschema.validate(block.input, SCHEMAS[block.name])


def test_anthropic_streamed_tool_use_after_a_tool_result(chat_anthropic):
    history = MESSAGES + [
        {"role": "assistant", "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris", "days": 1}},
        ]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"}]},
    ]
    count = chat_anthropic.messages.count_tokens(model=CHAT_MODEL_NAME, messages=history, tools=ANTHROPIC_TOOLS)
    assert count.input_tokens > 100
    with chat_anthropic.messages.stream(
        model=CHAT_MODEL_NAME, max_tokens=200, messages=history, tools=ANTHROPIC_TOOLS,
        tool_choice={"type": "tool", "name": "get_time"}, extra_body={"temperature": 0},
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    partial = [e.delta.partial_json for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
    assert len(partial) > 1
    assert final.stop_reason == "tool_use" and final.usage.input_tokens == count.input_tokens
    (block,) = final.content
    assert block.type == "tool_use" and block.name == "get_time" and block.input == json.loads("".join(partial))
    jsonschema.validate(block.input, TIME)


def test_anthropic_thinking_blocks(chat_anthropic):
    kwargs = dict(
        model=CHAT_MODEL_NAME, max_tokens=60, messages=MESSAGES, thinking={"type": "enabled", "budget_tokens": 1024},
        extra_body={"temperature": 0, "structured_outputs": {"regex": THINKING}},
    )
    message = chat_anthropic.messages.create(**kwargs)
    assert [b.type for b in message.content] == ["thinking", "text"]
    with chat_anthropic.messages.stream(**kwargs) as stream:
        final = stream.get_final_message()
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in final.content] == [
        (b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in message.content
    ]
