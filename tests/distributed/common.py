"""Shared prompts and the TP=1 reference for the distributed tests."""

from __future__ import annotations

import random
from pathlib import Path

from octavo import LLM, SamplingParams

NUM_NEW_TOKENS = 12
PROMPT_LENGTHS = (3, 17, 40, 9, 24)


def make_prompts(vocab_size: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab_size) for _ in range(n)] for n in PROMPT_LENGTHS]


def greedy(logprobs: int | None = None) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True, logprobs=logprobs)


def engine_options(**overrides) -> dict:
    options = dict(dtype="float32", max_model_len=256, max_num_seqs=16, num_kv_blocks=64)
    options.update(overrides)
    return options


def generate(llm: LLM, prompts: list[list[int]], params: SamplingParams):
    return llm.generate([{"prompt_token_ids": p} for p in prompts], params)


def token_ids(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def assert_same_tokens_and_logprobs(outputs, expected) -> None:
    """Token ids equal, the same logprob candidates, their values within 1e-5."""
    assert token_ids(outputs) == token_ids(expected)
    for output, ref in zip(outputs, expected):
        got, want = output.outputs[0].logprobs, ref.outputs[0].logprobs
        assert [list(p) for p in got] == [list(p) for p in want]
        assert all(abs(g[t].logprob - w[t].logprob) < 1e-5 for g, w in zip(got, want) for t in w)


def reference(path: Path, prompts: list[list[int]], params: SamplingParams):
    """The outputs of a single-process engine (TP=1, PP=1)."""
    llm = LLM(str(path), **engine_options())
    try:
        return generate(llm, prompts, params)
    finally:
        llm.engine.shutdown()


def vocab_size(path: Path) -> int:
    from octavo.models.config import load_arch_config

    return load_arch_config(path).vocab_size
