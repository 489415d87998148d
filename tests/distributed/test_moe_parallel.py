"""Mixture-of-experts models split over two gloo worker processes against
the single-process engine, float32: tensor parallel (every rank a slice of
every expert; OLMoE, whose q (and k) norm over all heads takes a sum over
the ranks) and expert parallel (``enable_expert_parallel``: 4 whole experts
per rank; Qwen2-MoE, with a tensor-parallel shared expert and its gate, a
dense layer and q/k/v biases); DeepSeek V3 splits its latent attention's heads
(the latent itself is replicated) and routes by groups. Greedy tokens must
be identical and logprobs within 1e-5.
"""

from __future__ import annotations

import dataclasses

import pytest

from octavo import LLM
from octavo.errors import InvalidArgumentError
from tests.distributed.common import (
    assert_same_tokens_and_logprobs,
    engine_options,
    generate,
    greedy,
    make_prompts,
    reference,
    vocab_size,
)


@pytest.mark.parametrize(
    "family,expert_parallel",
    [("olmoe", False), ("qwen2_moe", True), ("deepseek_v3", False)],
    ids=["olmoe-tp", "qwen2moe-ep", "deepseekv3-tp"],
)
def test_moe_parallel_matches_single_process(family, expert_parallel, family_dir):
    path = family_dir(family)
    prompts = make_prompts(vocab_size(path))[:3]
    expected = reference(path, prompts, greedy(logprobs=2))
    llm = LLM(str(path), **engine_options(tensor_parallel_size=2, enable_expert_parallel=expert_parallel))
    try:
        outputs = generate(llm, prompts, greedy(logprobs=2))
    finally:
        llm.engine.shutdown()
    assert_same_tokens_and_logprobs(outputs, expected)


def test_expert_parallel_needs_divisible_experts(family_dir):
    from octavo.distributed.checks import check_parallel_config
    from octavo.models.config import load_arch_config

    arch = load_arch_config(family_dir("mixtral"))  # 8 experts, 4 heads
    check_parallel_config(arch, 4, 1, expert_parallel=True)
    arch = dataclasses.replace(arch, moe=dataclasses.replace(arch.moe, num_experts=6))
    with pytest.raises(InvalidArgumentError, match="does not divide the 6 experts of MixtralForCausalLM"):
        check_parallel_config(arch, 4, 1, expert_parallel=True)
