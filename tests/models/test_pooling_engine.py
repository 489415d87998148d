"""Pooling through ``LLM``: steps packed by the token budget, truncation only on
request, Matryoshka dimensions, and clear errors for the wrong task."""

from __future__ import annotations

import numpy as np
import pytest

from octavo import PoolingParams, SamplingParams
from octavo.errors import InvalidArgumentError, PromptTooLongError, UnsupportedTaskError
from tests.models.test_pooling_parity import random_inputs, vocab_size

MAX_MODEL_LEN = 64


@pytest.fixture(scope="module")
def bert_llm(pooling_dirs):
    from octavo import LLM

    llm = LLM(str(pooling_dirs("bert")), dtype="float32", max_model_len=MAX_MODEL_LEN, max_num_batched_tokens=64)
    yield llm
    llm.engine.shutdown()


def embeddings(outputs) -> np.ndarray:
    return np.array([output.outputs.embedding for output in outputs])


def test_steps_pack_whole_inputs_under_the_token_budget(bert_llm, pooling_dirs, make_llm):
    prompts = random_inputs(vocab_size(pooling_dirs("bert")), lengths=[20, 7, 30, 12, 40, 3, 25, 9, 18, 64])
    steps = []
    bert_llm.engine.step_observer = lambda output: steps.append(dict(output.num_scheduled_tokens))
    try:
        packed = embeddings(bert_llm.embed([{"prompt_token_ids": p} for p in prompts]))
    finally:
        bert_llm.engine.step_observer = None
    assert all(sum(step.values()) <= 64 for step in steps)
    assert max(len(step) for step in steps) > 2  # many short inputs per step
    lengths = {n for step in steps for n in step.values()}
    assert lengths == {len(p) for p in prompts}  # never split
    one_by_one = [embeddings(bert_llm.embed([{"prompt_token_ids": p}]))[0] for p in prompts[:3]]
    assert np.allclose(packed[:3], one_by_one, atol=1e-5)
    assert bert_llm.engine.scheduler.kv.num_blocks == 0  # an encoder keeps no KV cache


def test_long_inputs_are_refused_unless_truncation_is_asked_for(bert_llm, pooling_dirs):
    long_ids = random_inputs(vocab_size(pooling_dirs("bert")), lengths=[MAX_MODEL_LEN + 5])[0]
    with pytest.raises(PromptTooLongError, match="truncate_prompt_tokens"):
        bert_llm.embed([{"prompt_token_ids": long_ids}])
    truncated = embeddings(bert_llm.embed([{"prompt_token_ids": long_ids}], truncate_prompt_tokens=-1))
    first = embeddings(bert_llm.embed([{"prompt_token_ids": long_ids[:MAX_MODEL_LEN]}]))
    assert np.allclose(truncated, first, atol=1e-6)
    text = " ".join(["the cat sits on the mat"] * 20)
    with pytest.raises(PromptTooLongError):
        bert_llm.embed(text)
    output = bert_llm.embed(text, truncate_prompt_tokens=10)[0]
    tokenizer = bert_llm.get_tokenizer()
    assert len(output.prompt_token_ids) == 10 and output.prompt_token_ids[-1] == tokenizer.sep_token_id
    with pytest.raises(InvalidArgumentError, match="truncate_prompt_tokens"):
        bert_llm.embed(text, truncate_prompt_tokens=MAX_MODEL_LEN + 1)


def test_texts_and_their_token_ids_embed_alike(bert_llm):
    texts = ["the cat sits on the mat", "what is a stock market?"]
    from_text = bert_llm.embed(texts)
    from_ids = bert_llm.embed([{"prompt_token_ids": o.prompt_token_ids} for o in from_text])
    assert np.allclose(embeddings(from_text), embeddings(from_ids), atol=1e-6)


def test_matryoshka_dimensions_truncate_then_normalize(bert_llm):
    text = "octavo returns one vector per input"
    full = np.array(bert_llm.embed(text, PoolingParams(normalize=False))[0].outputs.embedding)
    short = np.array(bert_llm.embed(text, PoolingParams(dimensions=8))[0].outputs.embedding)
    assert np.allclose(short, full[:8] / np.linalg.norm(full[:8]), atol=1e-6)
    with pytest.raises(InvalidArgumentError, match="exceeds the embedding size"):
        bert_llm.embed(text, PoolingParams(dimensions=33))


def test_the_wrong_task_is_refused_clearly(bert_llm, llama_dir, make_llm):
    with pytest.raises(UnsupportedTaskError, match="does not generate"):
        bert_llm.generate("the cat", SamplingParams(max_tokens=2))
    with pytest.raises(UnsupportedTaskError, match="serves 'embed' requests, not 'classify'"):
        bert_llm.classify("the cat")
    with pytest.raises(UnsupportedTaskError, match="generates text"):
        make_llm(llama_dir).embed("the cat")


def test_async_scheduling_is_refused_for_pooling(pooling_dirs):
    from octavo import LLM

    with pytest.raises(InvalidArgumentError, match="async_scheduling is for generation"):
        LLM(str(pooling_dirs("bert")), dtype="float32", async_scheduling=True)


def test_a_batch_of_short_texts_is_one_step_that_never_samples(pooling_dirs, make_llm):
    """256 short sentences fit the token budget: one step holds them all, the
    pooling step does not touch the sampler, and the vectors are transformers'
    (each sentence alone) within 1e-4."""
    import random

    import torch
    import torch.nn.functional as F

    from tests.models.pooling_checkpoints import WORDS, hf_hidden_states, hf_model

    path = pooling_dirs("bert")
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 14))) for _ in range(256)]
    llm = make_llm(path, max_model_len=MAX_MODEL_LEN, max_num_seqs=256, max_num_batched_tokens=256 * 16)
    runner = llm.engine.executor.worker.runner
    runner.sampler.sample = lambda *args, **kwargs: pytest.fail("a pooling step sampled")
    steps = []
    llm.engine.step_observer = lambda output: steps.append(len(output.num_scheduled_tokens))
    outputs = llm.embed(texts)
    assert steps == [256]
    model = hf_model(path)
    for output in outputs[::16]:
        ref = F.normalize(hf_hidden_states(model, output.prompt_token_ids).mean(0), dim=0).to(torch.float64)
        error = (torch.tensor(output.outputs.embedding, dtype=torch.float64) - ref).abs().max().item()
        assert error < 1e-4


def test_an_llm_freezes_its_startup_heap(pooling_dirs, make_llm, monkeypatch):
    """Out of the full collections a batch's garbage sets off (``core/gc_heap.py``)."""
    import gc

    monkeypatch.setenv("OCTAVO_GC_FREEZE", "1")
    gc.unfreeze()
    try:
        llm = make_llm(pooling_dirs("bert"), max_model_len=MAX_MODEL_LEN)
        assert gc.get_freeze_count() > 0
        assert len(llm.embed(["the cat sits on the mat"])[0].outputs.embedding) == 32
    finally:
        gc.unfreeze()
