"""Greedy responses from the server equal ``LLM.generate`` / ``LLM.chat`` on the same checkpoint,
through the official clients: sync and async, streaming and not, OpenAI and Anthropic."""

from __future__ import annotations

import asyncio

import openai
import pytest

from octavo import SamplingParams
from tests.entrypoints.server.conftest import MODEL_ALIAS, MODEL_NAME, async_anthropic, async_openai

PROMPTS = ["Once upon a time", "The fox walked to the river", "Octavo is"]
MESSAGES = [{"role": "system", "content": "You are a fox."}, {"role": "user", "content": "Where is the river?"}]
NUM_TOKENS = 12
# The anthropic client no longer types the sampling fields; the API (and this server) still takes them.
GREEDY_ANTHROPIC = {"temperature": 0.0, "top_k": 1}


def greedy(**overrides) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, **overrides)


@pytest.fixture(scope="module")
def expected(reference_llm):
    outputs = reference_llm.generate(PROMPTS, greedy(logprobs=2))
    chat = reference_llm.chat(MESSAGES, greedy())[0].outputs[0]
    return {"completions": [o.outputs[0] for o in outputs], "chat": chat}


def test_completion_matches_llm_generate(openai_client, expected):
    response = openai_client.completions.create(
        model=MODEL_NAME, prompt=PROMPTS, max_tokens=NUM_TOKENS, temperature=0, logprobs=2
    )
    assert [c.index for c in response.choices] == [0, 1, 2]
    num_tokens = 0
    for choice, reference in zip(response.choices, expected["completions"]):
        assert choice.text == reference.text
        assert choice.finish_reason == reference.finish_reason
        logprobs = choice.logprobs
        assert len(logprobs.tokens) == len(reference.token_ids)
        for got, entry, token_id in zip(logprobs.token_logprobs, reference.logprobs, reference.token_ids):
            assert got == pytest.approx(entry[token_id].logprob, abs=1e-4)
        assert all(len(top) >= 1 for top in logprobs.top_logprobs)
        assert logprobs.text_offset[0] == 0
        num_tokens += len(reference.token_ids)
    assert response.usage.completion_tokens == num_tokens
    assert response.model == MODEL_NAME


def test_token_id_prompt_and_alias(openai_client, reference_llm, expected):
    token_ids = reference_llm.get_tokenizer().encode(PROMPTS[0])
    response = openai_client.completions.create(model=MODEL_ALIAS, prompt=token_ids, max_tokens=NUM_TOKENS, temperature=0)
    assert response.choices[0].text == expected["completions"][0].text
    assert response.model == MODEL_ALIAS
    assert response.usage.prompt_tokens == len(token_ids)


def test_streamed_completion_matches(openai_client, expected):
    stream = openai_client.completions.create(
        model=MODEL_NAME, prompt=PROMPTS[1], max_tokens=NUM_TOKENS, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == expected["completions"][1].text
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [expected["completions"][1].finish_reason]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == len(expected["completions"][1].token_ids)


def test_stream_with_n_and_several_prompts(openai_client, expected):
    stream = openai_client.completions.create(
        model=MODEL_NAME, prompt=PROMPTS[:2], n=2, max_tokens=NUM_TOKENS, temperature=0, stream=True
    )
    texts: dict[int, str] = {}
    finished = set()
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            if choice.finish_reason:
                finished.add(choice.index)
    assert finished == {0, 1, 2, 3}
    # index = prompt * n + choice; greedy choices are all the same.
    assert texts == {i: expected["completions"][i // 2].text for i in range(4)}


def test_echo_prepends_prompt_and_its_logprobs(openai_client, reference_llm, expected):
    response = openai_client.completions.create(
        model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=NUM_TOKENS, temperature=0, echo=True, logprobs=1
    )
    choice = response.choices[0]
    assert choice.text == PROMPTS[0] + expected["completions"][0].text
    num_prompt_tokens = len(reference_llm.get_tokenizer().encode(PROMPTS[0]))
    assert len(choice.logprobs.tokens) == num_prompt_tokens + len(expected["completions"][0].token_ids)
    assert choice.logprobs.token_logprobs[0] is None and choice.logprobs.top_logprobs[0] is None
    assert all(lp is not None for lp in choice.logprobs.token_logprobs[1:])
    assert choice.logprobs.text_offset == sorted(choice.logprobs.text_offset)


def test_stop_string_ends_the_completion(openai_client, reference_llm, expected):
    reference = expected["completions"][0].text
    stop = reference[3:6]
    if not stop.strip():
        pytest.skip("the reference text has no usable stop string")
    want = reference_llm.generate(PROMPTS[0], greedy(stop=[stop]))[0].outputs[0]
    response = openai_client.completions.create(
        model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=NUM_TOKENS, temperature=0, stop=[stop]
    )
    assert response.choices[0].text == want.text
    assert response.choices[0].finish_reason == "stop"


def test_chat_matches_llm_chat(openai_client, expected):
    response = openai_client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_completion_tokens=NUM_TOKENS, temperature=0,
        logprobs=True, top_logprobs=3,
    )
    choice = response.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == expected["chat"].text
    content = choice.logprobs.content
    assert len(content) == len(expected["chat"].token_ids)
    assert all(len(entry.top_logprobs) == 3 for entry in content)
    for entry in content:
        ranked = [top.logprob for top in entry.top_logprobs]
        assert ranked == sorted(ranked, reverse=True)
        assert entry.logprob <= ranked[0] + 1e-6
    assert response.usage.completion_tokens == len(expected["chat"].token_ids)


def test_chat_stream_with_usage(openai_client, expected):
    stream = openai_client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=NUM_TOKENS, temperature=0, stream=True,
        stream_options={"include_usage": True}, n=2,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    texts = {0: "", 1: ""}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == {0: expected["chat"].text, 1: expected["chat"].text}
    assert chunks[-1].usage.completion_tokens == 2 * len(expected["chat"].token_ids)


def test_async_clients_match(server, expected):
    async def main():
        async with async_openai(server) as client, async_anthropic(server) as anthropic_client:
            completion, chat, message = await asyncio.gather(
                client.completions.create(model=MODEL_NAME, prompt=PROMPTS[2], max_tokens=NUM_TOKENS, temperature=0),
                client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=NUM_TOKENS, temperature=0),
                anthropic_client.messages.create(
                    model=MODEL_NAME, system=MESSAGES[0]["content"], messages=MESSAGES[1:], max_tokens=NUM_TOKENS,
                    extra_body=GREEDY_ANTHROPIC,
                ),
            )
            stream = await client.completions.create(
                model=MODEL_NAME, prompt=PROMPTS[2], max_tokens=NUM_TOKENS, temperature=0, stream=True
            )
            streamed = "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])
            async with anthropic_client.messages.stream(
                model=MODEL_NAME, system=MESSAGES[0]["content"], messages=MESSAGES[1:], max_tokens=NUM_TOKENS,
                extra_body=GREEDY_ANTHROPIC,
            ) as message_stream:
                streamed_message = "".join([text async for text in message_stream.text_stream])
            return completion, chat, message, streamed, streamed_message

    completion, chat, message, streamed, streamed_message = asyncio.run(main())
    assert completion.choices[0].text == expected["completions"][2].text == streamed
    assert chat.choices[0].message.content == expected["chat"].text
    assert message.content[0].text == expected["chat"].text == streamed_message


def test_anthropic_message_matches(anthropic_client, expected):
    message = anthropic_client.messages.create(
        model=MODEL_NAME, system=MESSAGES[0]["content"], messages=MESSAGES[1:], max_tokens=NUM_TOKENS,
        extra_body=GREEDY_ANTHROPIC,
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "text"
    assert message.content[0].text == expected["chat"].text
    reference = expected["chat"]
    assert message.stop_reason == ("max_tokens" if reference.finish_reason == "length" else "end_turn")
    assert message.usage.output_tokens == len(reference.token_ids)


def test_anthropic_stream_event_sequence(anthropic_client, expected):
    with anthropic_client.messages.stream(
        model=MODEL_NAME, system=MESSAGES[0]["content"], messages=MESSAGES[1:], max_tokens=NUM_TOKENS,
        extra_body=GREEDY_ANTHROPIC,
    ) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_message()
    raw = [e for e in events if e in {"message_start", "content_block_start", "content_block_delta",
                                      "content_block_stop", "message_delta", "message_stop"}]
    assert raw[:2] == ["message_start", "content_block_start"]
    assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(raw[2:-3]) <= {"content_block_delta"}
    assert final.content[0].text == expected["chat"].text
    assert final.usage.output_tokens == len(expected["chat"].token_ids)


def test_logit_bias_and_allowed_tokens_match_llm(openai_client, reference_llm, expected):
    """OpenAI's ``logit_bias`` (string keys), vLLM's ``allowed_token_ids`` and ``bad_words`` reach the
    sampler: the server's greedy text equals ``LLM.generate`` with the same edits, and
    differs from the unedited output."""
    plain_ids = expected["completions"][0].token_ids
    bias = {plain_ids[0]: -100.0, plain_ids[1]: -100.0, 30: 4.0}
    allowed = list(range(40, 400, 7))
    words = [reference_llm.get_tokenizer().decode(plain_ids[:1]).strip()]
    for edits, body in ((dict(logit_bias=bias), {"logit_bias": {str(t): b for t, b in bias.items()}}),
                        (dict(allowed_token_ids=allowed), {"extra_body": {"allowed_token_ids": allowed}}),
                        (dict(bad_words=words), {"extra_body": {"bad_words": words}})):
        reference = reference_llm.generate(PROMPTS[:1], greedy(**edits))[0].outputs[0]
        assert reference.token_ids != plain_ids
        response = openai_client.completions.create(
            model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=NUM_TOKENS, temperature=0, **body)
        assert response.choices[0].text == reference.text
        chat_reference = reference_llm.chat(MESSAGES, greedy(**edits))[0].outputs[0]
        chat = openai_client.chat.completions.create(
            model=MODEL_NAME, messages=MESSAGES, max_tokens=NUM_TOKENS, temperature=0, **body)
        assert chat.choices[0].message.content == chat_reference.text


def test_truncate_prompt_tokens_matches_llm(openai_client, reference_llm):
    """A prompt past max_model_len is a 400 unless ``truncate_prompt_tokens`` cuts it;
    cut, the answer is ``LLM.generate``'s on its last k tokens, and echo shows them."""
    from tests.entrypoints.server.conftest import MAX_MODEL_LEN

    token_ids = reference_llm.get_tokenizer().encode(" ".join(PROMPTS * 160))
    assert len(token_ids) > MAX_MODEL_LEN
    reference = reference_llm.generate([token_ids[-40:]], greedy())[0].outputs[0]
    response = openai_client.completions.create(
        model=MODEL_NAME, prompt=token_ids, max_tokens=NUM_TOKENS, temperature=0, echo=True,
        extra_body={"truncate_prompt_tokens": 40})
    echoed = reference_llm.get_tokenizer().decode(token_ids[-40:])
    assert response.choices[0].text == echoed + reference.text
    assert response.usage.prompt_tokens == 40
    chat = openai_client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": " ".join(PROMPTS * 160)}], max_tokens=NUM_TOKENS,
        temperature=0, extra_body={"truncate_prompt_tokens": 30})
    assert chat.usage.prompt_tokens == 30
    text = openai_client.completions.create(
        model=MODEL_NAME, prompt=" ".join(PROMPTS * 160), max_tokens=2, extra_body={"truncate_prompt_tokens": 20})
    assert text.usage.prompt_tokens == 20


def test_return_token_ids(openai_client, reference_llm, expected):
    """vLLM's ``return_token_ids``: the prompt's ids and each choice's (the stop token
    included) beside the text, whole and streamed; absent unless asked."""
    tokenizer = reference_llm.get_tokenizer()
    ask = {"extra_body": {"return_token_ids": True}}
    reference = expected["completions"][0]
    choice = openai_client.completions.create(
        model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=NUM_TOKENS, temperature=0, **ask).choices[0]
    assert choice.prompt_token_ids == tokenizer.encode(PROMPTS[0]) and choice.token_ids == reference.token_ids
    chunks = list(openai_client.completions.create(
        model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=NUM_TOKENS, temperature=0, stream=True, **ask))
    assert chunks[0].choices[0].prompt_token_ids == tokenizer.encode(PROMPTS[0])
    assert all(getattr(c.choices[0], "prompt_token_ids", None) is None for c in chunks[1:])
    assert [t for c in chunks for t in c.choices[0].token_ids] == reference.token_ids
    plain = openai_client.completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=2, temperature=0)
    assert "token_ids" not in plain.choices[0].model_dump() and "prompt_token_ids" not in plain.choices[0].model_dump()

    chat_reference = expected["chat"]
    chat = openai_client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=NUM_TOKENS, temperature=0, **ask)
    prompt_ids = reference_llm.chat(MESSAGES, greedy())[0].prompt_token_ids
    assert chat.prompt_token_ids == prompt_ids and chat.choices[0].token_ids == chat_reference.token_ids
    chunks = list(openai_client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=NUM_TOKENS, temperature=0, stream=True, **ask))
    assert chunks[0].prompt_token_ids == chat.prompt_token_ids
    assert all(getattr(c, "prompt_token_ids", None) is None for c in chunks[1:])
    assert [t for c in chunks for choice in c.choices for t in (choice.token_ids or [])] == chat_reference.token_ids


def test_return_tokens_as_token_ids(openai_client, reference_llm, expected):
    """vLLM's ``return_tokens_as_token_ids``: logprobs' tokens (echoed prompt, output, top
    alternatives; whole and streamed) written ``token_id:<id>``."""
    as_ids = {"extra_body": {"return_tokens_as_token_ids": True}}
    reference = expected["completions"][0]
    prompt_ids = reference_llm.get_tokenizer().encode(PROMPTS[0])
    logprobs = openai_client.completions.create(
        model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=NUM_TOKENS, temperature=0, logprobs=2, echo=True,
        **as_ids).choices[0].logprobs
    assert logprobs.tokens == [f"token_id:{t}" for t in prompt_ids + reference.token_ids]
    assert all(key.startswith("token_id:") for top in logprobs.top_logprobs[1:] for key in top)
    chunks = list(openai_client.completions.create(
        model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=NUM_TOKENS, temperature=0, logprobs=1, stream=True, **as_ids))
    assert [t for c in chunks for t in c.choices[0].logprobs.tokens] == [f"token_id:{t}" for t in reference.token_ids]
    chat = openai_client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=NUM_TOKENS, temperature=0, logprobs=True, top_logprobs=2,
        **as_ids)
    content = chat.choices[0].logprobs.content
    assert [entry.token for entry in content] == [f"token_id:{t}" for t in expected["chat"].token_ids]
    assert all(top.token.startswith("token_id:") for entry in content for top in entry.top_logprobs)


def test_prompt_logprobs(openai_client, reference_llm):
    """vLLM's ``prompt_logprobs``: per prompt position, the prompt token and the top k
    with ``LLM.generate``'s logprobs and ranks; refused with a stream."""
    reference = reference_llm.generate(PROMPTS[0], greedy(prompt_logprobs=2))[0]
    ask = {"extra_body": {"prompt_logprobs": 2}}
    choice = openai_client.completions.create(
        model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=2, temperature=0, echo=True, logprobs=3, **ask).choices[0]
    got = choice.prompt_logprobs
    assert len(got) == len(reference.prompt_token_ids) and got[0] is None
    for position, (entry, expected_entry) in enumerate(zip(got[1:], reference.prompt_logprobs[1:]), start=1):
        prompt_id = reference.prompt_token_ids[position]
        kept = {t for t, lp in expected_entry.items() if t == prompt_id or lp.rank <= 2}
        assert {int(t) for t in entry} == kept
        for token_id, value in entry.items():
            assert value["logprob"] == pytest.approx(expected_entry[int(token_id)].logprob, abs=1e-4)
            assert value["rank"] == expected_entry[int(token_id)].rank
    assert len(choice.logprobs.top_logprobs[1]) >= 3  # echo's own logprobs keep their 3
    chat = openai_client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=2, temperature=0, **ask)
    chat_reference = reference_llm.chat(MESSAGES, greedy(prompt_logprobs=2))[0]
    assert len(chat.prompt_logprobs) == len(chat_reference.prompt_token_ids)
    last_id = chat_reference.prompt_token_ids[-1]
    assert chat.prompt_logprobs[-1][str(last_id)]["logprob"] == pytest.approx(
        chat_reference.prompt_logprobs[-1][last_id].logprob, abs=1e-4)
    for create, body in ((openai_client.completions.create, {"prompt": PROMPTS[0]}),
                         (openai_client.chat.completions.create, {"messages": MESSAGES})):
        with pytest.raises(openai.BadRequestError, match="prompt_logprobs is not available with stream=true"):
            create(model=MODEL_NAME, max_tokens=2, stream=True, **body, **ask)
