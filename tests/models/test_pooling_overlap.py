"""An encoder's pooling steps overlapped (``runtime/pooling_runner.py``): the
engine keeps two in flight, launching the next while the host finishes the
one before. On a GPU that hides the host's work per step behind the
device's; here (``OCTAVO_POOLING_OVERLAP=1``: the CPU records no events, so
each launch completes before it returns) it checks the engine's side: the
same steps, the same vectors bit for bit and in order, errors as before,
nothing left behind."""

from __future__ import annotations

import pytest

from octavo.errors import InvalidArgumentError, PromptTooLongError
from tests.models.test_pooling_stream import MAX_MODEL_LEN, STEP, TEXTS, make


def assert_same(overlapped, plain):
    """Two engines' outputs of the same call: in the same order, bit for bit."""
    assert [(o.prompt, o.prompt_token_ids, o.outputs.raw) for o in overlapped] == [
        (o.prompt, o.prompt_token_ids, o.outputs.raw) for o in plain
    ]


@pytest.fixture
def overlapped_and_plain(pooling_dirs, monkeypatch):
    """Two engines of the same BERT checkpoint, overlapped and not."""
    monkeypatch.setenv("OCTAVO_POOLING_OVERLAP", "1")
    overlapped = make(pooling_dirs)
    monkeypatch.setenv("OCTAVO_POOLING_OVERLAP", "0")
    plain = make(pooling_dirs)
    yield overlapped, plain
    overlapped.engine.shutdown()
    plain.engine.shutdown()


@pytest.fixture(autouse=True, params=["lane", "scheduler"])
def pooling_path(request, monkeypatch):
    """Each test through the idle engine's pooling lane and through the scheduler."""
    monkeypatch.setenv("OCTAVO_POOLING_LANE", "1" if request.param == "lane" else "0")
    return request.param


def record_steps(llm) -> tuple[list[int], list[int]]:
    """Each step's request count, and how many batches were in flight at each
    launch (launched, less those whose outputs were processed: the observer)."""
    steps, in_flight, launched = [], [], []
    engine, execute = llm.engine, llm.engine.executor.execute_model

    def counting(scheduler_output, non_block=False):
        launched.append(1)
        in_flight.append(len(launched) - len(steps))
        return execute(scheduler_output, non_block)

    engine.executor.execute_model = counting
    engine.step_observer = lambda output: steps.append(len(output.num_scheduled_tokens))
    return steps, in_flight


def test_two_steps_in_flight_the_same_steps_and_vectors(overlapped_and_plain):
    overlapped, plain = overlapped_and_plain
    assert overlapped.engine.max_concurrent_batches == 2 and plain.engine.max_concurrent_batches == 1
    steps, in_flight = record_steps(overlapped)
    plain_steps, _ = record_steps(plain)
    assert_same(overlapped.embed(TEXTS), plain.embed(TEXTS))
    assert steps == plain_steps == [STEP, STEP, STEP, len(TEXTS) - 3 * STEP]  # full steps, not shared out
    assert max(in_flight) == 2  # the next step launched before the one before was collected
    assert not overlapped.engine.has_unfinished_requests() and not overlapped.engine._batches_in_flight


@pytest.mark.parametrize("name,run", [
    ("bert_cls3", lambda llm: [o.outputs.probs for o in llm.classify(TEXTS)]),
    ("bert_cross", lambda llm: [o.outputs.score for o in llm.score(TEXTS[0], TEXTS[1:])]),
], ids=["classify", "score"])
def test_classify_and_score_alike(name, run, pooling_dirs, monkeypatch):
    results = []
    for setting in ("1", "0"):
        monkeypatch.setenv("OCTAVO_POOLING_OVERLAP", setting)
        llm = make(pooling_dirs, name)
        try:
            assert llm.engine.max_concurrent_batches == (2 if setting == "1" else 1)
            results.append(run(llm))
        finally:
            llm.engine.shutdown()
    assert results[0] == results[1]


def test_a_bad_text_in_a_later_chunk_raises_as_before_and_leaves_nothing(overlapped_and_plain):
    overlapped, plain = overlapped_and_plain
    texts = list(TEXTS)
    texts[9] = " ".join(["cat"] * (MAX_MODEL_LEN + 3))
    errors = []
    for llm in (overlapped, plain):
        with pytest.raises(PromptTooLongError) as raised:
            llm.embed(texts)
        errors.append(str(raised.value))
        assert not llm.engine.has_unfinished_requests() and not llm.engine._batches_in_flight
    assert errors[0] == errors[1]
    assert_same(overlapped.embed(TEXTS), plain.embed(TEXTS))  # still serving


def test_a_failing_launch_leaves_nothing_in_flight(overlapped_and_plain, monkeypatch):
    overlapped, _ = overlapped_and_plain
    executor, calls = overlapped.engine.executor, []
    execute = executor.execute_model

    def failing(scheduler_output, non_block=False):
        calls.append(1)
        if len(calls) == 3:  # with a step in flight
            raise RuntimeError("the device went away")
        return execute(scheduler_output, non_block)

    monkeypatch.setattr(executor, "execute_model", failing)
    with pytest.raises(RuntimeError, match="went away"):
        overlapped.embed(TEXTS)
    monkeypatch.setattr(executor, "execute_model", execute)
    assert not overlapped.engine.has_unfinished_requests()
    assert len(overlapped.embed(TEXTS)) == len(TEXTS)


def test_where_steps_are_not_overlapped(pooling_dirs, monkeypatch):
    from octavo import LLM

    monkeypatch.delenv("OCTAVO_POOLING_OVERLAP", raising=False)
    llm = make(pooling_dirs)  # the CPU records no device events: nothing to overlap with
    try:
        assert llm.engine.max_concurrent_batches == 1
    finally:
        llm.engine.shutdown()
    monkeypatch.setenv("OCTAVO_POOLING_OVERLAP", "1")
    decoder = LLM(str(pooling_dirs("qwen3_embed")), dtype="float32", max_model_len=MAX_MODEL_LEN, max_num_seqs=STEP)
    try:
        assert decoder.engine.max_concurrent_batches == 1  # a decoder's steps share its KV cache and states
    finally:
        decoder.engine.shutdown()
    monkeypatch.setenv("OCTAVO_POOLING_OVERLAP", "yes")
    with pytest.raises(InvalidArgumentError, match="OCTAVO_POOLING_OVERLAP"):
        make(pooling_dirs)
