"""The LayerNorm families split over two gloo worker processes (tensor
parallel) against the single-process engine, float32: Cohere (its q/k
LayerNorms hold each rank's heads' weights; attention and MLP each sum
their partial outputs) and StarCoder 2 (the ungated MLP's ``c_fc`` split by
outputs, ``c_proj`` by inputs with its bias added once). Greedy tokens must
be identical and logprobs within 1e-5."""

from __future__ import annotations

import pytest

from octavo import LLM
from tests.distributed.common import (
    assert_same_tokens_and_logprobs,
    engine_options,
    generate,
    greedy,
    make_prompts,
    reference,
    vocab_size,
)


@pytest.mark.parametrize("family", ["cohere", "starcoder2"])
def test_tensor_parallel_matches_single_process(family, family_dir):
    path = family_dir(family)
    prompts = make_prompts(vocab_size(path))[:3]
    expected = reference(path, prompts, greedy(logprobs=2))
    llm = LLM(str(path), **engine_options(tensor_parallel_size=2))
    try:
        outputs = generate(llm, prompts, greedy(logprobs=2))
    finally:
        llm.engine.shutdown()
    assert_same_tokens_and_logprobs(outputs, expected)
