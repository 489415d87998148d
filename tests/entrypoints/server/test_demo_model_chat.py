"""``octavo serve`` with no model serves the demo model, and its chat template
works through the OpenAI and Anthropic routes (issue: the demo model)."""

from __future__ import annotations

import anthropic
import openai
import pytest

from octavo import LLM, SamplingParams
from tests.entrypoints.server.server_process import ServerProcess


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory):
    process = ServerProcess(None, ["--max-model-len", "512"], tmp_path_factory.mktemp("demo-server") / "server.log")
    process.wait_healthy()
    yield process
    process.stop()


def test_default_model_is_the_demo_model(demo_server):
    client = openai.OpenAI(base_url=f"{demo_server.url}/v1", api_key="unused")
    (model,) = client.models.list().data
    assert model.id == "octavo-demo" and model.root.endswith("assets/demo-model")


def test_chat_answers_like_llm_chat(demo_server):
    client = openai.OpenAI(base_url=f"{demo_server.url}/v1", api_key="unused")
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "What does a cow say?"}]
    response = client.chat.completions.create(model=model, messages=messages, max_tokens=32, temperature=0)
    answer = response.choices[0].message.content
    assert answer == "A cow says moo."
    assert response.choices[0].finish_reason == "stop"
    expected = LLM(dtype="float32").chat(messages, SamplingParams(temperature=0, max_tokens=32))[0].outputs[0].text
    assert answer == expected


def test_anthropic_messages_use_the_chat_template(demo_server):
    client = anthropic.Anthropic(base_url=demo_server.url, api_key="unused")
    message = client.messages.create(
        model="octavo-demo", max_tokens=32, messages=[{"role": "user", "content": "What does a cow say?"}],
        extra_body={"temperature": 0},
    )
    assert message.content[0].text == "A cow says moo."
    assert message.stop_reason == "end_turn"
