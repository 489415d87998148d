"""Speculative decoding under randomly drawn engine shapes and requests (a
fixed seed per case): tight KV caches (preemption), small token budgets
(chunked prefill, drafts cut by the budget), short and long max_tokens,
stop tokens, min_tokens, penalties, logprobs, both proposers. Every greedy
output must be the engine's without drafts."""

from __future__ import annotations

import random

import pytest

from octavo import SamplingParams
from tests.runtime.test_async_scheduling import assert_same_outputs, run
from tests.runtime.test_decode_overlap import vocab


def draw_requests(rng: random.Random, vocab_size: int, count: int):
    prompts, params = [], []
    for _ in range(count):
        # Prompts that repeat a short phrase give n-gram drafts something to find.
        phrase = [rng.randrange(3, vocab_size) for _ in range(rng.randint(2, 6))]
        prompts.append((phrase * 12)[: rng.randint(3, 60)])
        max_tokens = rng.randint(1, 40)
        extra = rng.choice([
            {}, {"logprobs": rng.randint(0, 3)}, {"repetition_penalty": 1.2}, {"presence_penalty": 0.5},
            {"min_tokens": rng.randint(1, max_tokens), "stop_token_ids": [1]}, {"stop_token_ids": [rng.randrange(3, vocab_size)]},
        ])
        params.append(SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **extra))
    return prompts, params


@pytest.mark.parametrize("case", range(4))
def test_random_shapes_keep_greedy_outputs(llama_dir, make_llm, case):
    rng = random.Random(1000 + case)
    prompts, params = draw_requests(rng, vocab(llama_dir), rng.randint(3, 10))
    block_size = rng.choice([4, 16])
    shape = dict(  # room for the longest request (100 tokens) and a little more: preemption is likely
        num_kv_blocks=-(-100 // block_size) + rng.randint(0, 8), max_num_batched_tokens=rng.choice([8, 16, 33, 64]),
        max_num_seqs=rng.choice([2, 4, 16]), block_size=block_size, enable_prefix_caching=rng.random() < 0.7,
    )
    if case % 2:
        speculative = {"model": str(llama_dir), "num_speculative_tokens": rng.randint(1, 5)}
    else:
        low = rng.randint(1, 3)
        speculative = {"method": "ngram", "num_speculative_tokens": rng.randint(1, 6), "prompt_lookup_min": low,
                       "prompt_lookup_max": low + rng.randint(0, 3)}
    expected = run(make_llm(llama_dir, **shape), prompts, params)
    llm = make_llm(llama_dir, speculative_config=speculative, **shape)
    assert_same_outputs(run(llm, prompts, params), expected)
    assert_same_outputs(run(llm, prompts, params), expected)  # again: prefix-cache hits where caching is on
    assert llm.engine.get_stats().spec_decoding.num_drafts > 0, (shape, speculative)


@pytest.mark.parametrize("case", range(2))
def test_random_sampling_under_random_shapes_ends_as_asked(llama_dir, make_llm, case):
    """Unseeded random requests (temperature, top-k/top-p/min-p, n=2) under a
    tight cache and budget: each ends at its max_tokens or a stop token."""
    rng = random.Random(2000 + case)
    prompts, params = draw_requests(rng, vocab(llama_dir), 6)
    params = [
        SamplingParams(n=2, temperature=rng.choice([0.3, 0.8, 1.2]), top_k=rng.choice([0, 5]), top_p=rng.choice([1.0, 0.9]),
                       min_p=rng.choice([0.0, 0.05]), max_tokens=p.max_tokens, ignore_eos=True, stop_token_ids=p.stop_token_ids)
        for p in params
    ]
    speculative = ({"model": str(llama_dir), "num_speculative_tokens": 3} if case else
                   {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3})
    llm = make_llm(llama_dir, speculative_config=speculative, num_kv_blocks=14, max_num_batched_tokens=24, block_size=8)
    for output, p in zip(llm.generate([{"prompt_token_ids": x} for x in prompts], params), params):
        for completion in output.outputs:
            stopped = completion.finish_reason == "stop" and completion.token_ids[-1] in (p.stop_token_ids or [])
            assert len(completion.token_ids) == p.max_tokens or stopped, completion
    assert llm.engine.get_stats().spec_decoding.num_drafts > 0
