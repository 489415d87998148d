"""An idle engine steps an encoder's pooling call itself (``core/pooling_lane.py``):
the steps the scheduler would form, the same vectors bit for bit and in
order, the same errors, and nothing of it in the scheduler or the output
processor; any other time (a request in the engine, a decoder's KV cache)
the call goes through the scheduler as before."""

from __future__ import annotations

import pytest

from octavo import PoolingParams
from octavo.core.pooling_lane import QueuedInputs, lane_setting
from octavo.errors import InvalidArgumentError, RequestTooLargeError
from tests.models.test_pooling_stream import TEXTS, WORDS

BUDGET = 24  # tokens a step: TEXTS' 3-9 tokens each cut steps by tokens, not only by count
MAX_SEQS = 5


def make(pooling_dirs, name="bert", **options):
    from octavo import LLM

    settings = dict(dtype="float32", max_model_len=BUDGET, max_num_seqs=MAX_SEQS, max_num_batched_tokens=BUDGET)
    return LLM(str(pooling_dirs(name)), **{**settings, **options})


@pytest.fixture(scope="module")
def bert_llm(pooling_dirs):
    llm = make(pooling_dirs)
    yield llm
    llm.engine.shutdown()


def traced(llm, monkeypatch, lane: bool, call):
    """``call()``'s outputs with the lane on or off, and each step's (request count, tokens)."""
    steps = []
    monkeypatch.setenv("OCTAVO_POOLING_LANE", "1" if lane else "0")
    monkeypatch.setattr(llm.engine, "step_observer",
                        lambda output: steps.append((len(output.num_scheduled_tokens), output.total_num_scheduled_tokens)))
    try:
        return call(), steps
    finally:
        monkeypatch.delenv("OCTAVO_POOLING_LANE")


def rows(outputs):
    return [(o.prompt, o.prompt_token_ids, o.outputs.raw, o.finish_reason) for o in outputs]


many = TEXTS * 3  # more than max_num_seqs: tokenized and stepped a chunk at a time


@pytest.mark.parametrize("call", [
    lambda llm: llm.embed(TEXTS[:4]),
    lambda llm: llm.embed(many),
    lambda llm: llm.embed(many, pooling_params=PoolingParams(dimensions=8)),
    lambda llm: llm.embed([{"prompt_token_ids": [2, 7, 9, 3]}, TEXTS[3], [2, 5, 3]]),
    lambda llm: llm.embed(many, truncate_prompt_tokens=3),
], ids=["one-step", "streamed", "dimensions", "token-ids", "truncated"])
def test_the_lane_forms_the_schedulers_steps_and_vectors(bert_llm, monkeypatch, call, request):
    direct, direct_steps = traced(bert_llm, monkeypatch, True, lambda: call(bert_llm))
    scheduled, scheduled_steps = traced(bert_llm, monkeypatch, False, lambda: call(bert_llm))
    assert rows(direct) == rows(scheduled)
    assert direct_steps == scheduled_steps
    assert all(count <= MAX_SEQS and tokens <= BUDGET for count, tokens in direct_steps)
    assert [o.request_id for o in direct] != [o.request_id for o in scheduled]  # fresh ids each call
    if "streamed" in request.node.name:
        assert any(count < MAX_SEQS for count, _ in direct_steps[:-1])  # some steps ended on the token budget


@pytest.mark.parametrize("name,run", [
    ("bert_cls3", lambda llm: [o.outputs.probs for o in llm.classify(many)]),
    ("bert_cross", lambda llm: [o.outputs.score for o in llm.score(TEXTS[0], TEXTS[1:])]),
], ids=["classify", "score"])
def test_classify_and_score_alike(pooling_dirs, monkeypatch, name, run):
    llm = make(pooling_dirs, name, max_model_len=64, max_num_batched_tokens=64)
    try:
        direct, _ = traced(llm, monkeypatch, True, lambda: run(llm))
        scheduled, _ = traced(llm, monkeypatch, False, lambda: run(llm))
    finally:
        llm.engine.shutdown()
    assert direct == scheduled


def test_the_lane_leaves_nothing_in_the_scheduler(bert_llm, monkeypatch):
    engine = bert_llm.engine
    monkeypatch.setattr(engine.scheduler, "schedule", lambda: pytest.fail("scheduled"))
    monkeypatch.setattr(engine.scheduler, "add_pooling_requests", lambda requests: pytest.fail("queued"))
    outputs = bert_llm.embed(many)
    assert len(outputs) == len(many) and all(o.finished and o.finish_reason == "stop" for o in outputs)
    metrics = outputs[0].metrics
    assert metrics.arrival_time <= metrics.first_scheduled_time <= metrics.finished_time
    assert not engine.has_unfinished_requests() and not engine._parent_children
    assert not engine.output_processor.pooling_states


def test_an_engine_with_work_or_a_kv_cache_schedules_the_call(bert_llm, pooling_dirs, monkeypatch):
    engine = bert_llm.engine
    assert engine.pools_directly()
    engine.add_request("elsewhere", {"prompt_token_ids": [2, 7, 3]}, PoolingParams(task="embed"))
    try:
        assert not engine.pools_directly()
        outputs = bert_llm.embed(TEXTS[:3])  # through the scheduler, beside the other request
        assert [o.prompt for o in outputs] == TEXTS[:3]
    finally:
        engine.abort_request("elsewhere")
    assert engine.pools_directly()
    monkeypatch.setenv("OCTAVO_POOLING_LANE", "0")
    assert not engine.pools_directly()
    monkeypatch.setenv("OCTAVO_POOLING_LANE", "on")
    with pytest.raises(InvalidArgumentError, match="OCTAVO_POOLING_LANE"):
        lane_setting()
    decoder = make(pooling_dirs, "qwen3_embed", max_model_len=64, max_num_batched_tokens=64)
    monkeypatch.delenv("OCTAVO_POOLING_LANE")
    try:
        assert not decoder.engine.pools_directly()  # a decoder's steps read and write its KV cache
    finally:
        decoder.engine.shutdown()


def test_an_input_no_step_holds_is_refused_as_the_scheduler_refuses_it(pooling_dirs, monkeypatch):
    llm = make(pooling_dirs, max_model_len=64)  # inputs up to 64 tokens
    # Steps of 24: the engine's own settings never make a pooling step shorter than
    # the longest input (``engine_args``), so a step's budget is lowered under it.
    llm.engine.scheduler.config.max_num_batched_tokens = BUDGET
    too_long = " ".join(WORDS[:9] * 3)
    errors = []
    try:
        for lane in (True, False):
            with pytest.raises(RequestTooLargeError) as raised:
                traced(llm, monkeypatch, lane, lambda: llm.embed([*TEXTS[:6], too_long, *TEXTS[6:]]))
            errors.append(str(raised.value))
            assert not llm.engine.has_unfinished_requests() and not llm.engine._parent_children
        assert errors[0] == errors[1] and "max_num_batched_tokens" in errors[0]
        assert len(llm.embed(TEXTS)) == len(TEXTS)  # still serving
    finally:
        llm.engine.shutdown()


def test_queued_inputs_make_a_step_once_it_is_full():
    queued = QueuedInputs()
    queued.token_ids = [[1] * n for n in (5, 5, 5)]
    assert queued.step_size(max_tokens=12, max_inputs=4, full_only=True) == 2  # the third would not fit
    assert queued.step_size(max_tokens=20, max_inputs=4, full_only=True) == 0  # more inputs could still join
    assert queued.step_size(max_tokens=20, max_inputs=4, full_only=False) == 3  # the inputs have ended
    assert queued.step_size(max_tokens=20, max_inputs=3, full_only=True) == 3  # as many inputs as a step takes
    assert QueuedInputs().step_size(max_tokens=20, max_inputs=3, full_only=False) == 0


def test_a_progress_bar_counts_every_input(bert_llm, monkeypatch):
    counted = []

    class Bar:  # tqdm's part the lane uses
        def __init__(self, total, **_):
            counted.append(total)

        def update(self, n):
            counted.append(n)

        def close(self):
            counted.append("closed")

    import tqdm.auto

    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)
    outputs = bert_llm.embed(many, use_tqdm=True)
    assert counted[0] == len(many) and counted[-1] == "closed"
    assert sum(counted[1:-1]) == len(outputs) == len(many)


@pytest.mark.parametrize("prompts,options", [
    ([[]], {}),
    ([TEXTS[0], [10**9]], {}),
    (TEXTS[:2], {"pooling_params": PoolingParams(task="classify")}),
    (TEXTS[:2], {"pooling_params": PoolingParams(dimensions=10**6)}),
], ids=["empty", "out-of-vocabulary", "other-task", "dimensions"])
def test_bad_inputs_raise_the_schedulers_errors(bert_llm, monkeypatch, prompts, options):
    errors = []
    for lane in ("1", "0"):
        monkeypatch.setenv("OCTAVO_POOLING_LANE", lane)
        with pytest.raises(Exception) as raised:
            bert_llm.embed(prompts, **options)
        errors.append((type(raised.value), str(raised.value)))
        assert not bert_llm.engine.has_unfinished_requests() and not bert_llm.engine._parent_children
    assert errors[0] == errors[1] and issubclass(errors[0][0], InvalidArgumentError)
    assert bert_llm.embed([]) == []
