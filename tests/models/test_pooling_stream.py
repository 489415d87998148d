"""``LLM.embed`` of more texts than one step takes tokenizes them a step's
worth at a time beside the engine (``entrypoints/pooling_stream.py``): the
same outputs, bit for bit and in order, as tokenizing and queueing them all
at once; the errors that need no tokens before any work; a bad input in a
later chunk raises what it raised before and leaves nothing in the engine."""

from __future__ import annotations

import threading

import pytest

import octavo.entrypoints.llm as llm_module
from octavo import PoolingParams
from octavo.entrypoints.pooling_stream import stream_chunk
from octavo.errors import InvalidArgumentError, PromptTooLongError

MAX_MODEL_LEN = 32
STEP = 4  # max_num_seqs: 15 texts are four chunks, the last short
WORDS = ["the", "cat", "sits", "on", "a", "mat", "dog", "runs", "Hello,", "World!", "naïve", "café"]
TEXTS = [" ".join(WORDS[(i * 5 + k) % len(WORDS)] for k in range(1 + i % 7)) for i in range(15)]


def make(pooling_dirs, name="bert", max_model_len=MAX_MODEL_LEN):
    from octavo import LLM

    return LLM(str(pooling_dirs(name)), dtype="float32", max_model_len=max_model_len, max_num_seqs=STEP)


@pytest.fixture(autouse=True, params=["lane", "scheduler"])
def pooling_path(request, monkeypatch):
    """Each test through the idle engine's pooling lane and through the scheduler
    (``OCTAVO_POOLING_LANE``; the server's engine always takes the scheduler)."""
    monkeypatch.setenv("OCTAVO_POOLING_LANE", "1" if request.param == "lane" else "0")
    return request.param


@pytest.fixture(scope="module")
def bert_llm(pooling_dirs):
    llm = make(pooling_dirs)
    yield llm
    llm.engine.shutdown()


def all_at_once(monkeypatch, call):
    """``call()`` with the texts tokenized and queued together, as before streaming."""
    with monkeypatch.context() as patch:
        patch.setattr(llm_module, "stream_chunk", lambda engine, num_texts: None)
        return call()


def tokenizer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("octavo-tokenize")]


def assert_same(streamed, together):
    assert [o.request_id for o in streamed] != [o.request_id for o in together]  # fresh ids each call
    assert len(streamed) == len(together)
    for a, b in zip(streamed, together):
        assert (a.prompt, a.prompt_token_ids) == (b.prompt, b.prompt_token_ids)
        assert a.outputs.raw == b.outputs.raw  # the same steps, bit for bit


def test_only_calls_of_more_than_one_step_stream(bert_llm):
    assert stream_chunk(bert_llm.engine, STEP) is None
    assert stream_chunk(bert_llm.engine, STEP + 1) == STEP
    assert stream_chunk(object(), 1000) is None  # an engine that does not say


@pytest.mark.parametrize("in_python", [False, True])
@pytest.mark.parametrize("options", [{}, {"truncate_prompt_tokens": 3}, {"pooling_params": PoolingParams(dimensions=8)}])
def test_streamed_outputs_are_those_of_one_batch_in_order(bert_llm, monkeypatch, options, in_python):
    """A chunk at a time: on a background thread where the library encodes, in
    the caller's thread where the tokenizer encodes in Python; the same outputs."""
    tokenized_on = []
    encode = llm_module.encode_text_columns
    def encode_noting_the_thread(*args, **kwargs):
        tokenized_on.append(threading.current_thread())
        return encode(*args, **kwargs)

    monkeypatch.setattr(llm_module, "encode_text_columns", encode_noting_the_thread)
    monkeypatch.setattr(llm_module, "encodes_in_python", lambda tokenizer: in_python)
    streamed = bert_llm.embed(TEXTS, **options)
    assert len(tokenized_on) == 4
    assert [t is threading.main_thread() for t in tokenized_on] == [in_python] * 4
    together = all_at_once(monkeypatch, lambda: bert_llm.embed(TEXTS, **options))
    assert_same(streamed, together)
    assert [o.prompt for o in streamed] == TEXTS
    if "truncate_prompt_tokens" in options:
        assert max(len(o.prompt_token_ids) for o in streamed) == 3


def test_bert_texts_are_tokenized_in_python_and_a_decoders_by_the_library(bert_llm, pooling_dirs):
    from octavo.core.tokenizer import encodes_in_python

    assert encodes_in_python(bert_llm.engine.tokenizer)  # word_ids' chunk cache
    decoder = make(pooling_dirs, "qwen3_embed", max_model_len=64)
    try:
        assert not encodes_in_python(decoder.engine.tokenizer)
    finally:
        decoder.engine.shutdown()


def test_classify_and_a_decoder_stream_alike(pooling_dirs, monkeypatch):
    for name, run in [("bert_cls3", lambda llm: llm.classify(TEXTS)), ("qwen3_embed", lambda llm: llm.embed(TEXTS))]:
        llm = make(pooling_dirs, name, max_model_len=64)  # the decoder's byte-level tokens are more
        try:
            assert_same(run(llm), all_at_once(monkeypatch, lambda: run(llm)))
        finally:
            llm.engine.shutdown()


@pytest.mark.parametrize(
    "bad, error",
    [({"truncate_prompt_tokens": MAX_MODEL_LEN + 1}, InvalidArgumentError),
     ({"pooling_params": PoolingParams(dimensions=33)}, InvalidArgumentError),
     ({"pooling_params": PoolingParams(task="classify")}, Exception)],
)
def test_errors_that_need_no_tokens_come_before_any_work(bert_llm, monkeypatch, bad, error):
    with monkeypatch.context() as patch:
        patch.setattr(llm_module, "encode_text_columns", lambda *a, **k: pytest.fail("tokenized"))
        patch.setattr(bert_llm.engine.executor, "execute_model", lambda *a, **k: pytest.fail("stepped"))
        with pytest.raises(error) as streamed:
            bert_llm.embed(TEXTS, **bad)
    with pytest.raises(error) as together:
        all_at_once(monkeypatch, lambda: bert_llm.embed(TEXTS, **bad))
    assert (type(streamed.value), str(streamed.value)) == (type(together.value), str(together.value))


def test_a_bad_text_in_a_later_chunk_raises_as_before_and_leaves_nothing(bert_llm, monkeypatch):
    texts = list(TEXTS)
    texts[9] = " ".join(["cat"] * (MAX_MODEL_LEN + 3))  # too long: in the third chunk
    texts[13] = " ".join(["dog"] * (MAX_MODEL_LEN + 9))  # also too long: the first one's error wins
    with pytest.raises(PromptTooLongError) as together:
        all_at_once(monkeypatch, lambda: bert_llm.embed(texts))
    with pytest.raises(PromptTooLongError) as streamed:
        bert_llm.embed(texts)
    assert str(streamed.value) == str(together.value)
    assert not bert_llm.engine.has_unfinished_requests()
    assert not bert_llm.engine._parent_children
    assert not tokenizer_threads()  # the call's tokenizing thread is gone with it
    assert_same(bert_llm.embed(TEXTS), all_at_once(monkeypatch, lambda: bert_llm.embed(TEXTS)))  # still serving


def test_a_failing_step_aborts_what_was_queued(bert_llm, monkeypatch, pooling_path):
    executor, calls = bert_llm.engine.executor, []
    execute = executor.execute_model

    def failing_step(scheduler_output, non_block=False):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("the device went away")
        return execute(scheduler_output, non_block)

    monkeypatch.setattr(executor, "execute_model", failing_step)
    with pytest.raises(RuntimeError, match="went away"):
        bert_llm.embed(TEXTS)
    monkeypatch.setattr(executor, "execute_model", execute)
    assert not bert_llm.engine.has_unfinished_requests()
    assert not tokenizer_threads()
    assert len(bert_llm.embed(TEXTS)) == len(TEXTS)
