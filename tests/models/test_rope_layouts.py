"""RoPE layouts beyond rotate-half: interleaved pairs (ERNIE 4.5) against HF's
own rotation, and the attention layer's choice of path for them and for
NoPE layers (SmolLM3): a backend that fuses the (rotate-half) rotation into
its cache write must not be handed either, and a NoPE layer's q and k must
reach the backend unrotated."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from octavo.core.attention import AttentionSpec
from octavo.models.layers.attention import Attention, ForwardContext
from octavo.models.layers.rotary import InterleavedRotaryEmbedding, RotaryEmbedding, apply_rotary_interleaved
from octavo.ops import reference

HEAD_SIZE, NUM_HEADS, NUM_KV_HEADS = 16, 4, 2


def qk(num_tokens: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(num_tokens, NUM_HEADS, HEAD_SIZE, generator=gen).to(dtype)
    k = torch.randn(num_tokens, NUM_KV_HEADS, HEAD_SIZE, generator=gen).to(dtype)
    return q, k


def ops() -> SimpleNamespace:
    return SimpleNamespace(rotary_embedding=reference.rotary_embedding, rotary_and_cache=reference.rotary_and_cache)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_interleaved_rotation_matches_hf_ernie(dtype):
    from transformers.models.ernie4_5.modeling_ernie4_5 import apply_rotary_pos_emb

    rotary = InterleavedRotaryEmbedding(HEAD_SIZE, 64, 500000.0, None, ops=ops())
    positions = torch.tensor([0, 1, 7, 63, 30])
    q, k = qk(len(positions), dtype)
    ours = rotary(positions, q.clone(), k.clone())
    # HF's cos/sin: each frequency twice over, [cos | cos], as its rotary module returns them.
    half = rotary.cos_sin_cache[positions]
    cos, sin = (torch.cat([part, part], dim=-1)[None] for part in half.chunk(2, dim=-1))
    hf_q, hf_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    assert torch.equal(ours[0], hf_q[0].transpose(0, 1)) and torch.equal(ours[1], hf_k[0].transpose(0, 1))


def test_partial_interleaved_rotation_matches_hf_glm4():
    """A table narrower than the head: the leading dims rotate in pairs, the rest pass through."""
    from transformers.models.glm4.modeling_glm4 import apply_rotary_pos_emb

    table = RotaryEmbedding(HEAD_SIZE // 2, 64, 10000.0, None, ops=ops()).cos_sin_cache
    positions = torch.tensor([2, 9, 40])
    q, k = qk(len(positions))
    ours = apply_rotary_interleaved(positions, q, k, table)
    cos, sin = (torch.cat([part, part], dim=-1)[None] for part in table[positions].chunk(2, dim=-1))
    hf_q, hf_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    assert torch.equal(ours[0], hf_q[0].transpose(0, 1)) and torch.equal(ours[1], hf_k[0].transpose(0, 1))


def test_interleaved_is_rotate_half_of_the_deinterleaved_head():
    """The same rotation, read through the permutation that takes even then odd dimensions."""
    positions = torch.arange(9) * 5
    table = RotaryEmbedding(HEAD_SIZE, 64, 10000.0, None, ops=ops()).cos_sin_cache
    q, k = qk(len(positions))
    perm = torch.cat([torch.arange(0, HEAD_SIZE, 2), torch.arange(1, HEAD_SIZE, 2)])
    half_q, half_k = reference.rotary_embedding(positions, q[..., perm], k[..., perm], table)
    inter_q, inter_k = apply_rotary_interleaved(positions, q, k, table)
    torch.testing.assert_close(inter_q[..., perm], half_q)
    torch.testing.assert_close(inter_k[..., perm], half_k)


class FusingBackend:
    """Declares the fused rotary path; records which path each call took and what q, k it got."""

    fuses_rotary = True

    def __init__(self) -> None:
        self.spec = AttentionSpec(NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE, HEAD_SIZE**-0.5, torch.float32, torch.float32, 16)
        self.calls: list[tuple[str, torch.Tensor, torch.Tensor]] = []

    def forward(self, query, key, value, kv_cache, metadata):
        self.calls.append(("plain", query.clone(), key.clone()))
        return query

    def forward_with_rotary(self, query, key, value, kv_cache, metadata, positions, cos_sin_cache, rotary_and_cache):
        self.calls.append(("fused", query.clone(), key.clone()))
        return query


@pytest.mark.parametrize("layout", ["nope", "interleaved", "rotate_half"])
def test_attention_takes_the_fused_rotary_path_only_for_rotate_half(layout):
    backend = FusingBackend()
    attention = Attention(backend, 0, ops=ops())
    rotary = {
        "nope": None,
        "interleaved": InterleavedRotaryEmbedding(HEAD_SIZE, 64, 10000.0, None, ops=ops()),
        "rotate_half": RotaryEmbedding(HEAD_SIZE, 64, 10000.0, None, ops=ops()),
    }[layout]
    positions = torch.tensor([3, 4, 5])
    q, k = qk(3)
    attention(q.clone(), k.clone(), torch.zeros_like(k), ForwardContext(None, [None]), positions, rotary)
    [(path, seen_q, seen_k)] = backend.calls
    if layout == "rotate_half":
        assert path == "fused" and torch.equal(seen_q, q)  # the backend rotates
        return
    expected = (q, k) if layout == "nope" else apply_rotary_interleaved(positions, q, k, rotary.cos_sin_cache)
    assert path == "plain" and torch.equal(seen_q, expected[0]) and torch.equal(seen_k, expected[1])
