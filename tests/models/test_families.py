"""Every family beyond Llama/Mistral/Qwen against Hugging Face transformers,
float32 on the CPU: Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE (8 or 16 experts,
top-2/4/8, a shared expert, dense layers among sparse ones), Gemma 2 (logit
soft-capping, alternating sliding window), Gemma 3 (head size 256, local
and global RoPE), Phi-3 (LongRoPE), Phi-4-mini (LongRoPE over 3/4 of each
head), GLM and GLM-4 (interleaved RoPE over half of each head; GLM-4's
post-attention and post-MLP norms), OLMo 2, Granite, DeepSeek V2 / V3
(latent attention, YaRN with mscale, grouped routing by softmax or by
sigmoid with a correction bias, shared experts, a dense first layer),
GLM-4.5 (q/k norms, RoPE over half of each head, DeepSeek V3's routing),
dots.llm1 (q/k norms, biases on q/k/v/o, a sliding layer, the same routing),
EXAONE 4.0 (post-norms, q/k norms, a sliding RoPE layer and a global NoPE one),
ERNIE 4.5 MoE (a softmax router with a correction bias, shared experts, a biased LM head),
OLMo 3 (a sliding layer, RoPE per layer type), Seed-OSS (q/k/v biases apart
from o_proj's), SmolLM3 (a NoPE layer), ERNIE 4.5 (interleaved RoPE),
Granite MoE with and without a shared MLP (fused experts, top-k softmax),
StarCoder 2 (LayerNorms with biases, an ungated MLP), Cohere (parallel
attention and MLP, per-head q/k LayerNorms, logit scale), Cohere2
(a sliding layer with RoPE, a global one without) and gpt-oss (attention
sinks, biased router and experts, clamped SwiGLU, YaRN, a sliding layer).

Per family, greedy with EOS masked as HF's ``min_new_tokens`` does: token
ids identical to HF ``generate`` and chosen-token logprobs within 1e-4;
then the same prompts again (prefix-cache hits); then an engine with a
7-token budget and 6 KV blocks (chunked prefill and preemption at once).
"""

from __future__ import annotations

import pytest

from octavo import SamplingParams
from tests.checkpoints import FAMILIES
from tests.hf_reference import hf_greedy
from tests.models.test_hf_parity import check_against_hf, make_prompts

pytestmark = pytest.mark.usefixtures("one_thread")

NUM_NEW_TOKENS = 16
PROMPT_LENGTHS = (3, 17, 31, 40)


def greedy() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, min_tokens=NUM_NEW_TOKENS, logprobs=5)


def family_prompts(path) -> list[list[int]]:
    from octavo.models.config import load_arch_config

    prompts = make_prompts(load_arch_config(path).vocab_size, seed=3)
    return [p for p in prompts if len(p) in PROMPT_LENGTHS]


def generate(llm, prompts):
    return llm.generate([{"prompt_token_ids": p} for p in prompts], greedy())


@pytest.mark.parametrize("family", FAMILIES)
def test_family_matches_hf(family, family_dir, make_llm):
    path = family_dir(family)
    prompts = family_prompts(path)
    refs = [hf_greedy(path, p, NUM_NEW_TOKENS) for p in prompts]

    llm = make_llm(path)
    check_against_hf(generate(llm, prompts), refs)
    again = generate(llm, prompts)  # the prompts' full blocks are cached now
    assert [o.num_cached_tokens for o in again] == [(len(p) - 1) // 16 * 16 for p in prompts]
    check_against_hf(again, refs)

    small = make_llm(path, max_num_batched_tokens=7, num_kv_blocks=6, enable_prefix_caching=False)
    check_against_hf(generate(small, prompts), refs)
    assert small.engine.get_stats().num_preemptions > 0
