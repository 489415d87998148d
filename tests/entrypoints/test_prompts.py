"""Prompt text -> token ids off the event loop (``prompts`` on the ``TokenizerPool``): the same
ids as the tokenizer's own ``encode``, size limits before any work, errors that name what the
client sent, and chat rendering that continues a final message when asked."""

from __future__ import annotations

import asyncio
import threading

import pytest

from octavo.core.tokenizer import load_tokenizer
from octavo.default_model import DEMO_MODEL_DIR
from octavo.entrypoints.openai.chat_template import ChatOptions
from octavo.entrypoints.openai.prompts import (
    PromptLimits,
    default_max_prompt_chars,
    encode_conversation,
    encode_text,
)
from octavo.entrypoints.openai.tokenizer_pool import TokenizerPool
from octavo.errors import InvalidArgumentError, PromptTooLongError

TEXTS = ["Once upon a time", "Hello <|user|> world</s>", " lead space", "ünïcödé 日本語", "  two\n\nlines\t", "x"]
LIMITS = PromptLimits(max_model_len=4096, max_prompt_chars=10_000)


@pytest.fixture(scope="module", params=["demo", "llama2"])
def tokenizer(request):
    if request.param == "demo":
        return load_tokenizer(DEMO_MODEL_DIR)
    return load_tokenizer(request.getfixturevalue("llama2_tokenizer_dir"))


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_the_same_ids_as_the_tokenizer(tokenizer, add_special_tokens):
    for text in TEXTS:
        expected = tokenizer.encode(text, add_special_tokens=add_special_tokens)
        assert encode_text(tokenizer, text, add_special_tokens, LIMITS).token_ids == expected, text


def test_limits_come_first(tokenizer):
    with pytest.raises(PromptTooLongError, match="the prompt is 10001 characters long; the limit is 10000"):
        encode_text(tokenizer, "x" * 10_001, True, LIMITS)
    tight = PromptLimits(max_model_len=8, max_prompt_chars=None)
    with pytest.raises(PromptTooLongError, match=r"^the prompt has \d+ tokens but max_model_len is 8") as caught:
        encode_text(tokenizer, "Once upon a time " * 10, True, tight)
    assert caught.value.param == "prompt"
    # /tokenize counts any length.
    assert len(encode_text(tokenizer, "Once upon a time " * 10, True, tight, fit_context=False).token_ids) > 8


def test_chat_errors_name_the_messages(tokenizer):
    tokenizer.chat_template = tokenizer.chat_template or "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    conversation = [{"role": "user", "content": "Once upon a time " * 10}]
    with pytest.raises(PromptTooLongError, match=r"^the messages take \d+ tokens but max_model_len is 8 \(they must") as caught:
        encode_conversation(tokenizer, conversation, ChatOptions(), PromptLimits(8))
    assert caught.value.param == "messages"
    with pytest.raises(PromptTooLongError, match="the messages are 170 characters long; the limit is 100"):
        encode_conversation(tokenizer, conversation, ChatOptions(), PromptLimits(4096, 100))


def test_continue_final_message():
    tokenizer = load_tokenizer(DEMO_MODEL_DIR)
    conversation = [{"role": "user", "content": "Tell me a story."}, {"role": "assistant", "content": "Once upon"}]
    continued = encode_conversation(tokenizer, conversation, ChatOptions(False, True), LIMITS)
    assert continued.text == "<|user|>\nTell me a story.</s>\n<|assistant|>\nOnce upon"
    with pytest.raises(InvalidArgumentError, match="exclude each other"):
        encode_conversation(tokenizer, conversation, ChatOptions(True, True), LIMITS)


def test_default_character_limit(tokenizer):
    """No token covers more characters than the vocabulary's longest: a longer text cannot fit."""
    longest = max(len(token) for token in tokenizer.get_vocab())
    limit = default_max_prompt_chars(tokenizer, 512)
    assert limit == 512 * longest * 2
    text = "Once upon a time, there was a little fox. " * 100
    num_tokens = len(tokenizer.encode(text))
    assert len(text) <= default_max_prompt_chars(tokenizer, num_tokens + 1)


def test_the_pool_runs_on_its_own_threads_with_their_own_tokenizers():
    tokenizer = load_tokenizer(DEMO_MODEL_DIR)
    pool = TokenizerPool(tokenizer, num_workers=2)

    def where(worker_tokenizer, text):
        return threading.current_thread().name, id(worker_tokenizer), encode_text(worker_tokenizer, text, True, LIMITS)

    async def main():
        return await asyncio.gather(*(pool.run(where, text) for text in TEXTS * 4))

    try:
        results = asyncio.run(main())
    finally:
        pool.shutdown()
    assert all(name.startswith("octavo-tokenizer") for name, _, _ in results)
    assert id(tokenizer) not in {tokenizer_id for _, tokenizer_id, _ in results}
    assert [r[2].token_ids for r in results] == [tokenizer.encode(t) for t in TEXTS * 4]
