"""On a CUDA GPU: a tiny float32 Llama with Llama 3.1's RoPE scaling at
positions past 32k (a 40,000-token prompt, chunked prefill through the
Triton backend) against Hugging Face on the same GPU, and async scheduling
against the synchronous engine there. Skipped without a GPU."""

from __future__ import annotations

import random

import pytest
import torch

from octavo import SamplingParams
from tests.checkpoints import build_checkpoint
from tests.hf_reference import assert_tokens_match, hf_greedy
from tests.models.test_long_context import LLAMA_31_ROPE

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROMPT_LEN, NEW_TOKENS = 40_000, 8


@pytest.fixture(scope="module")
def long_llama(tmp_path_factory, tokenizer_dir):
    return build_checkpoint(
        tmp_path_factory.mktemp("long-gpu"), "llama", tokenizer_dir, rope_parameters=LLAMA_31_ROPE,
        max_position_embeddings=65536,
    )


def test_positions_past_32k_match_hf(long_llama, make_llm):
    from octavo.models.config import load_arch_config

    vocab = load_arch_config(long_llama).vocab_size
    rng = random.Random(11)
    prompt = [rng.randrange(3, vocab) for _ in range(PROMPT_LEN)]
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=5)
    options = dict(platform="cuda", max_model_len=PROMPT_LEN + 64, max_num_batched_tokens=8192, max_num_seqs=2)
    [ours] = make_llm(long_llama, **options).generate([{"prompt_token_ids": prompt}], params)
    completion = ours.outputs[0]
    top5 = [sorted(d, key=lambda t: d[t].rank)[:5] for d in completion.logprobs]
    assert_tokens_match(completion.token_ids, hf_greedy(long_llama, prompt, NEW_TOKENS, device="cuda"), top5)
    [fast] = make_llm(long_llama, async_scheduling=True, **options).generate([{"prompt_token_ids": prompt}], params)
    assert fast.outputs[0].token_ids == completion.token_ids
