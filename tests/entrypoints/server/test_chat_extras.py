"""vLLM's chat extensions ``echo``, ``add_special_tokens``, ``documents`` and
``include_reasoning`` through the openai client: what each changes, checked
against the offline engine on the same prompt or against the plain answer."""

from __future__ import annotations

import httpx
import pytest

from octavo.entrypoints.openai.chat_template import ChatOptions, render_chat_text
from tests.entrypoints.server.conftest import CHAT_MODEL_NAME, MODEL_NAME
from tests.entrypoints.server.test_tools_and_reasoning import MESSAGES as CHAT_MESSAGES
from tests.entrypoints.server.test_tools_and_reasoning import THINKING

PREFILL = [{"role": "user", "content": "Where is the river?"}, {"role": "assistant", "content": "The river is"}]
GREEDY = {"max_tokens": 8, "temperature": 0}


def test_echo_prepends_the_prefill_streamed_and_not(openai_client):
    continued = {"continue_final_message": True, "add_generation_prompt": False}
    plain = openai_client.chat.completions.create(model=MODEL_NAME, messages=PREFILL, extra_body=continued, **GREEDY)
    echoed = openai_client.chat.completions.create(
        model=MODEL_NAME, messages=PREFILL, extra_body={**continued, "echo": True}, **GREEDY
    )
    assert echoed.choices[0].message.content == "The river is" + plain.choices[0].message.content
    stream = openai_client.chat.completions.create(
        model=MODEL_NAME, messages=PREFILL, extra_body={**continued, "echo": True}, stream=True, **GREEDY
    )
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices) == (
        echoed.choices[0].message.content
    )
    # The last message is the user's: nothing to echo.
    asked = openai_client.chat.completions.create(model=MODEL_NAME, messages=PREFILL[:1], extra_body={"echo": True}, **GREEDY)
    again = openai_client.chat.completions.create(model=MODEL_NAME, messages=PREFILL[:1], **GREEDY)
    assert asked.choices[0].message.content == again.choices[0].message.content


def test_add_special_tokens_puts_the_bos_before_the_template(chat_server, chat_openai):
    # The chat model has the Llama 2 tokenizer, which writes <s> (id 1) when asked for special tokens.
    headers = {"Authorization": "Bearer unused"}
    plain = httpx.post(f"{chat_server.url}/tokenize", json={"messages": CHAT_MESSAGES}, headers=headers, timeout=60).json()
    with_bos = httpx.post(f"{chat_server.url}/tokenize", json={"messages": CHAT_MESSAGES, "add_special_tokens": True},
                          headers=headers, timeout=60).json()
    assert with_bos["tokens"] == [1, *plain["tokens"]]
    counts = [
        chat_openai.chat.completions.create(model=CHAT_MODEL_NAME, messages=CHAT_MESSAGES, max_tokens=1,
                                            extra_body=extra).usage.prompt_tokens
        for extra in ({}, {"add_special_tokens": True})
    ]
    assert counts == [plain["count"], plain["count"] + 1]


def test_documents_reach_the_template(llama2_tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(llama2_tokenizer_dir))
    tokenizer.chat_template = (
        "{% for d in documents or [] %}[{{ d.title }}: {{ d.text }}]{% endfor %}"
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    )
    documents = [{"title": "Rivers", "text": "The Seine flows through Paris."}]
    text = render_chat_text(tokenizer, PREFILL[:1], ChatOptions(add_generation_prompt=False, documents=documents))
    assert text == "[Rivers: The Seine flows through Paris.]user: Where is the river?\n"


@pytest.mark.parametrize("stream", [False, True])
def test_include_reasoning_false_leaves_the_reasoning_out(chat_openai, stream):
    extra = {"structured_outputs": {"regex": THINKING}}
    kwargs = dict(model=CHAT_MODEL_NAME, messages=CHAT_MESSAGES, max_tokens=60, temperature=0)
    shown = chat_openai.chat.completions.create(**kwargs, extra_body=extra).choices[0].message
    response = chat_openai.chat.completions.create(**kwargs, extra_body={**extra, "include_reasoning": False}, stream=stream)
    if stream:
        deltas = [chunk.choices[0].delta for chunk in response if chunk.choices]
        assert not any(getattr(d, "reasoning_content", None) for d in deltas)
        content = "".join(d.content or "" for d in deltas)
    else:
        message = response.choices[0].message
        assert getattr(message, "reasoning_content", None) is None
        content = message.content
    assert shown.reasoning_content and content == shown.content


def test_usage_counts_the_prompt_tokens_read_from_the_prefix_cache(openai_client):
    story = "The cached fox walks along the long river bank every single morning. " * 6
    for route in ("chat", "completions"):
        counts = []
        for _ in range(2):
            if route == "chat":
                usage = openai_client.chat.completions.create(
                    model=MODEL_NAME, messages=[{"role": "user", "content": story}], max_tokens=1).usage
            else:
                usage = openai_client.completions.create(model=MODEL_NAME, prompt=story + "!", max_tokens=1).usage
            counts.append((usage.prompt_tokens_details.cached_tokens, usage.prompt_tokens))
        (first, num_prompt_tokens), (second, _) = counts
        assert first == 0 and 0 < second < num_prompt_tokens, (route, counts)
    stream = openai_client.completions.create(model=MODEL_NAME, prompt=story + "!", max_tokens=1, stream=True,
                                              stream_options={"include_usage": True})
    usage = [chunk.usage for chunk in stream if chunk.usage][0]
    assert usage.prompt_tokens_details.cached_tokens == second


def test_anthropic_usage_counts_cache_reads(anthropic_client):
    story = "The anthropic fox reads the cached river map again and again. " * 6
    kwargs = dict(model=MODEL_NAME, max_tokens=1, messages=[{"role": "user", "content": story}])
    first = anthropic_client.messages.create(**kwargs).usage
    second = anthropic_client.messages.create(**kwargs).usage
    assert first.cache_read_input_tokens == 0 and 0 < second.cache_read_input_tokens < second.input_tokens
    with anthropic_client.messages.stream(**kwargs) as stream:
        streamed = stream.get_final_message().usage
    assert streamed.cache_read_input_tokens == second.cache_read_input_tokens


def test_tokenize_counts_a_chat_with_its_tools_and_returns_token_strings(chat_server, chat_openai):
    from tests.entrypoints.server.test_tools_and_reasoning import TOOLS

    headers = {"Authorization": "Bearer unused"}
    body = {"messages": CHAT_MESSAGES, "tools": TOOLS, "chat_template_kwargs": {"enable_thinking": False},
            "return_token_strs": True}
    counted = httpx.post(f"{chat_server.url}/tokenize", json=body, headers=headers, timeout=60).json()
    chat = chat_openai.chat.completions.create(
        model=CHAT_MODEL_NAME, messages=CHAT_MESSAGES, tools=TOOLS, tool_choice="none", max_tokens=1,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert counted["count"] == chat.usage.prompt_tokens == len(counted["token_strs"])
    plain = httpx.post(f"{chat_server.url}/tokenize", json={"messages": CHAT_MESSAGES}, headers=headers, timeout=60).json()
    assert counted["count"] > plain["count"] and "token_strs" not in plain
    refused = httpx.post(f"{chat_server.url}/tokenize", json={"prompt": "x", "tools": TOOLS}, headers=headers, timeout=60)
    assert refused.status_code == 400


def test_reset_prefix_cache_forgets_cached_prefixes(server, openai_client):
    from tests.entrypoints.server.conftest import API_KEY

    story = "The forgetful fox counts the stones along the river, one by one, every day. " * 6

    def cached() -> int:
        usage = openai_client.completions.create(model=MODEL_NAME, prompt=story, max_tokens=1).usage
        return usage.prompt_tokens_details.cached_tokens

    cached()
    assert cached() > 0
    reset = httpx.post(f"{server.url}/reset_prefix_cache", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)
    assert reset.status_code == 200 and reset.json() == {"reset": True}
    assert cached() == 0


def test_llm_reset_prefix_cache(reference_llm):
    from octavo import SamplingParams

    prompt = "The offline fox caches the same long story about rivers and stones, again. " * 6
    params = SamplingParams(temperature=0.0, max_tokens=1)
    reference_llm.generate([prompt], params)
    assert reference_llm.generate([prompt], params)[0].num_cached_tokens > 0
    assert reference_llm.reset_prefix_cache() is True
    assert reference_llm.generate([prompt], params)[0].num_cached_tokens == 0
    # While a request holds blocks nothing is forgotten (the server answers 409, prefix_cache_busy).
    engine = reference_llm.engine
    engine.add_request("holding", prompt, SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    assert engine.reset_prefix_cache() is False
    engine.abort_request(["holding"])
    assert engine.reset_prefix_cache() is True
    from octavo.entrypoints.openai.errors import from_octavo
    from octavo.errors import PrefixCacheBusyError

    error = from_octavo(PrefixCacheBusyError("busy"))
    assert (error.status, error.code) == (409, "prefix_cache_busy")
