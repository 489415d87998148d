"""``LLM.embed`` queues its inputs as one batch (``core/pooling_batch.py``):
the same vectors as one request at a time, the same error for the first bad
input, and nothing queued when any input is refused."""

from __future__ import annotations

import numpy as np
import pytest

from octavo import PoolingParams
from octavo.core.pooling_batch import PoolingBatch
from octavo.errors import InvalidArgumentError, PromptTooLongError
from tests.models.test_pooling_parity import random_inputs, vocab_size

MAX_MODEL_LEN = 32
TEXTS = ["the cat sits on the mat", "a dog runs", "Hello, World!", "naïve café", "the [SEP] token", "x"]


@pytest.fixture(scope="module")
def bert_llm(pooling_dirs):
    from octavo import LLM

    llm = LLM(str(pooling_dirs("bert")), dtype="float32", max_model_len=MAX_MODEL_LEN, max_num_seqs=32)
    yield llm
    llm.engine.shutdown()


def test_the_batch_gives_the_vectors_of_one_request_at_a_time(bert_llm, monkeypatch):
    batched = bert_llm.embed(TEXTS)
    monkeypatch.setattr(bert_llm.engine, "add_pooling_requests", None)  # LLM falls back to add_request
    one_by_one = bert_llm.embed(TEXTS)
    for a, b in zip(batched, one_by_one):
        assert (a.prompt, a.prompt_token_ids) == (b.prompt, b.prompt_token_ids)
        assert a.outputs.raw == b.outputs.raw  # the same step, bit for bit


def one_by_one_error(llm, prompts):
    with pytest.raises(Exception) as caught:
        for prompt in prompts:
            llm.engine.add_request(None, {"prompt_token_ids": prompt}, PoolingParams(task="embed"))
    llm.engine.abort_request(list(llm.engine._parent_children))
    return caught.value


@pytest.mark.parametrize("bad", ["out_of_vocab", "too_long", "empty"])
def test_the_first_bad_input_raises_what_add_request_raises_and_nothing_is_queued(bert_llm, pooling_dirs, bad):
    vocab = vocab_size(pooling_dirs("bert"))
    prompts = random_inputs(vocab, lengths=[5, 6, 7, MAX_MODEL_LEN + 1])
    prompts[1] = {"out_of_vocab": [4, vocab], "too_long": [4] * (MAX_MODEL_LEN + 2), "empty": []}[bad]
    expected = one_by_one_error(bert_llm, prompts)
    with pytest.raises(type(expected)) as caught:
        bert_llm.embed([{"prompt_token_ids": p} for p in prompts])
    assert str(caught.value) == str(expected)
    assert isinstance(caught.value, (InvalidArgumentError, PromptTooLongError))
    assert not bert_llm.engine.has_unfinished_requests()
    assert len(bert_llm.embed(["still serving"])) == 1


def test_request_ids_in_use_are_refused_before_anything_is_queued(bert_llm):
    engine = bert_llm.engine
    params = PoolingParams(task="embed")
    for ids in (["a", "b", "a"], ["c", "in-use"]):
        engine.add_request("in-use", [5, 6], params)
        with pytest.raises(InvalidArgumentError, match="already in use"):
            engine.add_pooling_requests(PoolingBatch(ids, [None] * len(ids), [[5, 6]] * len(ids), [None] * len(ids)), params)
        engine.abort_request("in-use")
        assert not engine.has_unfinished_requests()


def test_segment_ids_are_checked_per_input(bert_llm):
    batch = PoolingBatch(["s1", "s2"], [None, None], [[5, 6], [5, 6, 7]], [None, [0, 1]])
    with pytest.raises(InvalidArgumentError, match="token_type_ids has 2 entries for 3 tokens"):
        bert_llm.engine.add_pooling_requests(batch, PoolingParams(task="embed"))
    assert not bert_llm.engine.has_unfinished_requests()
    assert np.isfinite(bert_llm.embed(["ok"])[0].outputs.data).all()


def test_a_step_that_raised_is_computed_whole_again(bert_llm, monkeypatch):
    """The encoder's runner keeps no state between steps: a request scheduled
    again after its step raised is described whole again."""
    engine = bert_llm.engine
    expected = bert_llm.embed(TEXTS)
    model, failures = engine.executor.worker.runner.model, []

    def forward_failing_once(*args, forward=model.forward, **kwargs):
        if not failures:
            failures.append(1)
            raise RuntimeError("the device failed once")
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", forward_failing_once)
    ids = [engine.add_request(None, {"prompt_token_ids": e.prompt_token_ids}, PoolingParams(task="embed")) for e in expected]
    with pytest.raises(RuntimeError, match="failed once"):
        engine.step()
    outputs = {}
    while engine.has_unfinished_requests():
        outputs.update((output.request_id, output) for output in engine.step())
    assert [outputs[i].outputs.raw for i in ids] == [e.outputs.raw for e in expected]


class StubTokenizer:
    def __init__(self, size: int) -> None:
        self.vocab = {f"t{i}": i for i in range(size)}
        self.lookups = 0

    def __len__(self) -> int:
        return len(self.vocab)

    def get_vocab(self) -> dict[str, int]:
        self.lookups += 1
        return self.vocab


def test_ids_from_the_tokenizer_are_checked_unless_its_largest_id_fits():
    from types import SimpleNamespace

    from octavo.core.pooling_batch import TokenizerIdBound, check_pooling_batch
    from octavo.core.pooling_params import PoolerConfig

    tokenizer, bound = StubTokenizer(10), TokenizerIdBound()
    assert (bound.largest(tokenizer), bound.largest(tokenizer), tokenizer.lookups) == (9, 9, 1)
    tokenizer.vocab["added"] = 10
    assert (bound.largest(tokenizer), tokenizer.lookups) == (10, 2)  # a token added: looked at again
    limits = SimpleNamespace(pooler=PoolerConfig(task="embed", output_size=4), max_model_len=8, vocab_size=10)
    validator = SimpleNamespace(limits=limits, tokenizer=tokenizer, tokenizer_id_bound=bound)
    validator.validate = lambda ids, params: pytest.fail("validated one by one")
    batch = PoolingBatch(["a"], ["text"], [[3, 12]], [None], from_tokenizer=True)
    with pytest.raises(pytest.fail.Exception, match="one by one"):  # id 10 can come out of it: checked
        check_pooling_batch(validator, batch, PoolingParams(task="embed"), {})
    del tokenizer.vocab["added"]
    check_pooling_batch(validator, batch, PoolingParams(task="embed"), {})  # trusted: the tokenizer stops at 9
