"""``LLM.chat`` / ``render_chat`` with vLLM's template options: tools,
``continue_final_message``, ``chat_template_kwargs`` and ``documents`` reach
the chat template as they do through ``apply_chat_template``, and the output
is the engine's on that prompt; bad combinations are typed errors."""

from __future__ import annotations

import pytest

from octavo import SamplingParams
from octavo.errors import InvalidArgumentError

TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]
PREFILL = [{"role": "user", "content": "What time is it?"}, {"role": "assistant", "content": "It is"}]


@pytest.fixture(scope="module")
def chat_llm(chat_model_dir):
    from octavo import LLM

    llm = LLM(str(chat_model_dir), dtype="float32", max_model_len=512)
    yield llm
    llm.engine.shutdown()


@pytest.mark.parametrize("options", [
    {"tools": TOOLS},
    {"continue_final_message": True, "add_generation_prompt": False},
    {"chat_template_kwargs": {"enable_thinking": False}},
    {"documents": [{"title": "t", "text": "d"}]},
], ids=["tools", "continue", "kwargs", "documents"])
def test_options_reach_the_template(chat_llm, options):
    tokenizer = chat_llm.get_tokenizer()
    messages = PREFILL if options.get("continue_final_message") else PREFILL[:1]
    options = dict(options)
    add_generation_prompt = options.pop("add_generation_prompt", True)
    kwargs = options.pop("chat_template_kwargs", {})
    expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                             **options, **kwargs)
    rendered = chat_llm.render_chat(messages, add_generation_prompt=add_generation_prompt, **options,
                                    **({"chat_template_kwargs": kwargs} if kwargs else {}))
    assert rendered["prompt"] == expected
    if "tools" in options:
        assert "get_time" in expected
    if options.get("continue_final_message"):
        assert expected.endswith("It is")
    params = SamplingParams(temperature=0.0, max_tokens=6)
    chat = chat_llm.chat(messages, params, add_generation_prompt=add_generation_prompt, **options,
                         **({"chat_template_kwargs": kwargs} if kwargs else {}))
    plain = chat_llm.generate([rendered["prompt_token_ids"]], params)
    assert chat[0].outputs[0].token_ids == plain[0].outputs[0].token_ids


def test_bad_combinations_are_typed_errors(chat_llm):
    with pytest.raises(InvalidArgumentError):
        chat_llm.render_chat(PREFILL, continue_final_message=True)  # add_generation_prompt defaults to True
    with pytest.raises(InvalidArgumentError):
        chat_llm.render_chat(PREFILL[:1], chat_template_kwargs={"tools": []})
