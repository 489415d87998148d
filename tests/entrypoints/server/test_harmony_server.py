"""gpt-oss's harmony output through the server (``--reasoning-parser
openai_gptoss --tool-call-parser openai --enable-auto-tool-choice``), on a
tiny random ``GptOssForCausalLM`` with a tokenizer whose harmony markers are
special tokens (``tests/harmony_checkpoint.py``).

As in ``test_tools_and_reasoning.py``, a regex constraint pins the random
model's text; on chat a ``logit_bias`` on the markers makes it write them as
their special tokens (checked through ``return_token_ids``), which the
parsers must then see although clients never do. The Responses and Anthropic
routes take no ``logit_bias``: there the same text may come in smaller tokens,
and is read the same way."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("xgrammar")

from starlette.testclient import TestClient  # noqa: E402

from octavo import LLM  # noqa: E402
from octavo.entrypoints.openai.app import build_app  # noqa: E402
from octavo.entrypoints.openai.config import ServerConfig  # noqa: E402
from tests.harmony_checkpoint import HARMONY_TOKENS, build_harmony_checkpoint, build_harmony_tokenizer, token_id  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
REASONING = r"<\|channel\|>analysis<\|message\|>(yes|no) (so|then)<\|end\|>"
CALL = (REASONING + r"<\|start\|>assistant<\|channel\|>commentary to=functions\.get_weather <\|constrain\|>json"
        r'<\|message\|>\{"city": "[a-z]{2,6}"\}')
FINAL = REASONING + r"<\|start\|>assistant<\|channel\|>final<\|message\|>(Fine|Good)\."


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("harmony")
    tokenizer_dir = build_harmony_tokenizer(root / "tokenizer")
    llm = LLM(str(build_harmony_checkpoint(root / "gpt-oss", tokenizer_dir)), dtype="float32", max_model_len=256,
              num_kv_blocks=64)
    config = ServerConfig(served_model_names=["m"], reasoning_parser="openai_gptoss", tool_call_parser="openai",
                          enable_auto_tool_choice=True)
    with TestClient(build_app(llm.engine, config)) as client:
        client.llm = llm
        client.marker_ids = {token_id(tokenizer_dir, token): token for token in HARMONY_TOKENS}
        yield client
    llm.engine.shutdown()


def chat(served, regex: str, **extra) -> dict:
    bias = {str(index): 100 for index in served.marker_ids}
    body = {"model": "m", "messages": MESSAGES, "tools": TOOLS, "max_tokens": 120, "temperature": 0,
            "structured_outputs": {"regex": regex}, "logit_bias": bias, **extra}
    response = served.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response


def no_markers(payload) -> None:
    assert not any(marker in json.dumps(payload) for marker in HARMONY_TOKENS)


def test_gpt_oss_stops_on_return_and_call(served):
    # gpt-oss's generation_config.json makes <|return|> and <|call|> end an answer.
    eos = {served.marker_ids.get(index) for index in served.llm.engine.limits.eos_token_ids}
    assert {"<|return|>", "<|call|>"} <= eos


def test_chat_reads_reasoning_and_a_call(served):
    choice = chat(served, CALL, return_token_ids=True).json()["choices"][0]
    written = [served.marker_ids[index] for index in choice.pop("token_ids") if index in served.marker_ids]
    assert written == ["<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|channel|>", "<|constrain|>",
                       "<|message|>", "<|call|>"]  # the markers came as special tokens, <|call|> ended it
    message = choice["message"]
    assert choice["finish_reason"] == "tool_calls" and message["content"] is None
    assert message["reasoning_content"] in {f"{a} {b}" for a in ("yes", "no") for b in ("so", "then")}
    [call] = message["tool_calls"]
    assert call["function"]["name"] == "get_weather" and set(json.loads(call["function"]["arguments"])) == {"city"}
    no_markers(choice)


def test_chat_streams_the_same(served):
    whole = chat(served, CALL).json()["choices"][0]["message"]
    events = chat(served, CALL, stream=True).text.split("\n\n")
    chunks = [json.loads(event[len("data: "):]) for event in events if event.startswith("data: {")]
    reasoning, arguments, names, finish = "", "", [], None
    for chunk in chunks:
        delta = chunk["choices"][0]["delta"]
        reasoning += delta.get("reasoning_content") or ""
        assert not delta.get("content")
        for call in delta.get("tool_calls", []):
            if "id" in call:
                names.append(call["function"]["name"])
            arguments += call["function"].get("arguments") or ""
        finish = chunk["choices"][0]["finish_reason"] or finish
        no_markers(chunk)
    assert (reasoning, names, arguments, finish) == (
        whole["reasoning_content"], ["get_weather"], whole["tool_calls"][0]["function"]["arguments"], "tool_calls")


def test_chat_reads_a_final_answer(served):
    choice = chat(served, FINAL).json()["choices"][0]
    assert choice["message"]["content"] in ("Fine.", "Good.") and choice["message"]["reasoning_content"]
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    no_markers(choice)


def test_responses_items(served):
    body = {"model": "m", "input": "Weather in Paris?", "temperature": 0, "max_output_tokens": 120, "store": False,
            "tools": [{"type": "function", "name": "get_weather", "parameters": TOOLS[0]["function"]["parameters"]}]}
    called = served.post("/v1/responses", json={**body, "structured_outputs": {"regex": CALL}}).json()
    assert [item["type"] for item in called["output"]] == ["reasoning", "function_call"], called
    assert called["output"][0]["content"][0]["text"] and called["output"][1]["name"] == "get_weather"
    answered = served.post("/v1/responses", json={**body, "structured_outputs": {"regex": FINAL}}).json()
    assert [item["type"] for item in answered["output"]] == ["reasoning", "message"], answered
    assert answered["output"][1]["content"][0]["text"] in ("Fine.", "Good.")
    no_markers(called)
    no_markers(answered)


def test_anthropic_messages_blocks(served):
    body = {"model": "m", "max_tokens": 120, "temperature": 0, "messages": MESSAGES, "structured_outputs": {"regex": CALL},
            "tools": [{"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}]}
    response = served.post("/v1/messages", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert [block["type"] for block in answer["content"]] == ["thinking", "tool_use"], answer
    assert answer["stop_reason"] == "tool_use" and set(answer["content"][1]["input"]) == {"city"}
    no_markers(answer)
