"""Llama 3.1's 128k context: its RoPE scaling (``rope_type: llama3``) against
Hugging Face at positions up to 128k, and a model end to end (chunked
prefill) at positions far past its original context, against HF greedy."""

from __future__ import annotations

import random

import pytest
import torch

from octavo import SamplingParams
from tests.checkpoints import build_checkpoint
from tests.hf_reference import assert_tokens_match, hf_greedy

LLAMA_31_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def test_llama31_rope_matches_hf_up_to_128k():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from octavo.models.layers.rotary import compute_inv_freq

    head_dim, max_positions = 128, 131072
    config = LlamaConfig(
        hidden_size=4096, num_attention_heads=32, max_position_embeddings=max_positions, rope_parameters=LLAMA_31_ROPE
    )
    positions = torch.tensor([[0, 1, 4095, 8191, 8192, 32767, 32768, 65536, 100003, max_positions - 1]])
    hf_cos, hf_sin = LlamaRotaryEmbedding(config)(torch.zeros(1, dtype=torch.float32), positions)
    # The table Octavo indexes by position (cos | sin halves), for just these rows.
    inv_freq, scaling = compute_inv_freq(head_dim, LLAMA_31_ROPE["rope_theta"], LLAMA_31_ROPE, max_positions)
    freqs = positions[0].to(torch.float32)[:, None] * inv_freq[None, :]
    assert scaling == 1.0
    torch.testing.assert_close(freqs.cos(), hf_cos[0, :, : head_dim // 2], rtol=0, atol=1e-6)
    torch.testing.assert_close(freqs.sin(), hf_sin[0, :, : head_dim // 2], rtol=0, atol=1e-6)
    # The long wavelengths are the ones scaled: past the original context
    # they differ from unscaled RoPE.
    plain, _ = compute_inv_freq(head_dim, LLAMA_31_ROPE["rope_theta"], None, max_positions)
    assert torch.equal(inv_freq[:8], plain[:8]) and torch.allclose(inv_freq[-8:], plain[-8:] / 8)


@pytest.fixture(scope="module")
def short_rope_llama(tmp_path_factory, tokenizer_dir):
    """A tiny Llama whose RoPE was 'trained' for 32 positions and scaled 8x (llama3)."""
    rope = {**LLAMA_31_ROPE, "rope_theta": 10000.0, "original_max_position_embeddings": 32}
    return build_checkpoint(tmp_path_factory.mktemp("long"), "llama", tokenizer_dir, rope_parameters=rope)


def test_positions_far_past_the_original_context_match_hf(short_rope_llama, make_llm):
    """A 700-token prompt (22x the original 32), prefilled in chunks of 128."""
    from octavo.models.config import load_arch_config

    vocab = load_arch_config(short_rope_llama).vocab_size
    rng = random.Random(7)
    prompt = [rng.randrange(3, vocab) for _ in range(700)]
    llm = make_llm(short_rope_llama, max_model_len=1024, max_num_batched_tokens=128)
    [output] = llm.generate(
        [{"prompt_token_ids": prompt}], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=5)
    )
    completion = output.outputs[0]
    top5 = [sorted(d, key=lambda t: d[t].rank)[:5] for d in completion.logprobs]
    assert_tokens_match(completion.token_ids, hf_greedy(short_rope_llama, prompt, 12), top5)


def test_startup_says_how_many_tokens_fit(llama_dir, make_llm, caplog):
    """Memory planning: the KV cache's tokens, in sequences of max_model_len,
    and a warning when not even one fits."""
    import logging

    with caplog.at_level(logging.INFO, logger="octavo.runtime.kv_plan"):
        # 8 KiB per block of 16 tokens (2 layers x K,V x 2 heads x 16 dims x fp32): 8 blocks.
        make_llm(llama_dir, kv_cache_memory_bytes=64 << 10, max_model_len=256)
    text = caplog.text
    assert "(128 tokens, 0.1 MiB): 0.50 sequences of max_model_len 256 fit" in text
    assert "fewer than max_model_len (256)" in text
