"""``octavo serve`` with no model serves the demo model, and its chat template
works through the OpenAI and Anthropic routes (issue: the demo model); a chat
without ``max_tokens`` runs to the end of the story, as OpenAI's and vLLM's do
(issue 14, item 4)."""

from __future__ import annotations

import anthropic
import openai
import pytest

from octavo import LLM, SamplingParams
from tests.entrypoints.server.conftest import API_KEY, DEMO_MODEL

STORY = [{"role": "user", "content": "Tell me a story."}]


@pytest.fixture(scope="module")
def demo_llm():
    """The offline engine on the demo model: the reference."""
    llm = LLM(dtype="float32")
    yield llm
    llm.engine.shutdown()


def test_default_model_is_the_demo_model(demo_server):
    client = openai.OpenAI(base_url=f"{demo_server.url}/v1", api_key=API_KEY)
    (model,) = client.models.list().data
    # The name the operator used (none: the demo model's), never a path on the server's disk.
    assert model.id == DEMO_MODEL and model.root == DEMO_MODEL


def test_chat_answers_like_llm_chat(demo_server, demo_llm):
    client = openai.OpenAI(base_url=f"{demo_server.url}/v1", api_key=API_KEY)
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "What does a cow say?"}]
    response = client.chat.completions.create(model=model, messages=messages, max_tokens=32, temperature=0)
    answer = response.choices[0].message.content
    assert answer == "A cow says moo."
    assert response.choices[0].finish_reason == "stop"
    expected = demo_llm.chat(messages, SamplingParams(temperature=0, max_tokens=32))[0].outputs[0].text
    assert answer == expected


def test_chat_without_max_tokens_tells_the_whole_story(demo_server):
    """LangChain, litellm and the openai SDK send no max_tokens: the answer is not cut at 16 tokens."""
    client = openai.OpenAI(base_url=f"{demo_server.url}/v1", api_key=API_KEY)
    response = client.chat.completions.create(model=DEMO_MODEL, messages=STORY, temperature=0)
    choice = response.choices[0]
    assert choice.finish_reason == "stop"  # the model's EOS, not a length cap
    assert choice.message.content.startswith("Once upon a time") and choice.message.content.endswith("The end.")
    assert response.usage.completion_tokens > 16
    streamed = client.chat.completions.create(model=DEMO_MODEL, messages=STORY, temperature=0, stream=True)
    chunks = list(streamed)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == choice.message.content
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_anthropic_messages_use_the_chat_template(demo_server):
    client = anthropic.Anthropic(base_url=demo_server.url, api_key=API_KEY)
    message = client.messages.create(
        model=DEMO_MODEL, max_tokens=32, messages=[{"role": "user", "content": "What does a cow say?"}],
        extra_body={"temperature": 0},
    )
    assert message.content[0].text == "A cow says moo."
    assert message.stop_reason == "end_turn"


def test_anthropic_assistant_prefill_continues_the_turn(demo_server, demo_llm):
    """A last assistant message is continued (vLLM's continue_final_message), not closed for a new turn."""
    prefill = "Once upon a time, there was a little fox"
    client = anthropic.Anthropic(base_url=demo_server.url, api_key=API_KEY)
    message = client.messages.create(
        model=DEMO_MODEL, max_tokens=200, extra_body={"temperature": 0},
        messages=[*STORY, {"role": "assistant", "content": prefill}],
    )
    # The offline engine on the text the prefill must render to: the turn left open after the prefill.
    llm = demo_llm
    rendered = llm.get_tokenizer().apply_chat_template(STORY, tokenize=False, add_generation_prompt=True) + prefill
    prompt_ids = llm.get_tokenizer().encode(rendered, add_special_tokens=False)
    expected = llm.generate({"prompt_token_ids": prompt_ids}, SamplingParams(temperature=0, max_tokens=200))[0]
    assert message.content[0].text == expected.outputs[0].text
    assert message.content[0].text.startswith(" named") and message.stop_reason == "end_turn"
    # The OpenAI route offers the same as vLLM's continue_final_message.
    chat = openai.OpenAI(base_url=f"{demo_server.url}/v1", api_key=API_KEY).chat.completions.create(
        model=DEMO_MODEL, temperature=0, max_tokens=200, extra_body={"continue_final_message": True},
        messages=[*STORY, {"role": "assistant", "content": prefill}],
    )
    assert chat.choices[0].message.content == message.content[0].text


def test_json_mode_answers_with_json(demo_server):
    """The demo model learnt to answer "... Answer in JSON." questions as {"answer": ...}
    (scripts/demo_grammar.py); JSON mode holds it to a JSON object."""
    import json

    client = openai.OpenAI(base_url=f"{demo_server.url}/v1", api_key=API_KEY)
    completion = client.chat.completions.create(
        model=DEMO_MODEL, messages=[{"role": "user", "content": "What does a cow say? Answer in JSON."}],
        response_format={"type": "json_object"}, max_tokens=64, temperature=0,
    )
    assert completion.choices[0].finish_reason == "stop"
    assert json.loads(completion.choices[0].message.content) == {"answer": "A cow says moo."}
