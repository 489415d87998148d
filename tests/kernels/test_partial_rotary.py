"""Partial rotary (Phi-4-mini, GLM): ``RotaryEmbedding`` with ``rotary_dim``
below the head size rotates each head's first ``rotary_dim`` dims and leaves
the rest bit for bit, through the reference op and through the Triton
kernel (on views of those dims, rotated in place; Triton's interpreter on
the CPU); a whole model on the Triton path keeps the reference path's
tokens without the backend's fused rotary + KV write, whose table would
have to be as wide as the head."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from octavo.errors import UnsupportedModelError  # noqa: E402
from octavo.kernels.rotary import apply_rotary  # noqa: E402
from octavo.models.layers.rotary import RotaryEmbedding  # noqa: E402
from octavo.ops.dispatch import reference_layer_ops  # noqa: E402
from tests.plugins.fake_plugins import sandbox  # noqa: E402, F401

HEADS, KV_HEADS, HEAD_SIZE, ROTARY_DIM, BASE = 4, 2, 32, 24, 10000.0
POSITIONS = [0, 1, 7, 50, 99, 127]


def qkv(dtype, device):
    """A fused qkv output and its q, k views (as the decoder hands them over)."""
    generator = torch.Generator().manual_seed(0)
    fused = torch.randn(len(POSITIONS), (HEADS + 2 * KV_HEADS) * HEAD_SIZE, generator=generator)
    fused = fused.to(device=device, dtype=dtype)
    q = fused[:, : HEADS * HEAD_SIZE].view(len(POSITIONS), HEADS, HEAD_SIZE)
    k = fused[:, HEADS * HEAD_SIZE : (HEADS + KV_HEADS) * HEAD_SIZE].view(len(POSITIONS), KV_HEADS, HEAD_SIZE)
    return fused, q, k


def direct(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """HF's partial rotary written out: frequencies over ``ROTARY_DIM`` dims,
    rotate-half within them, the other dims as they are (float32)."""
    inv_freq = 1.0 / BASE ** (torch.arange(0, ROTARY_DIM, 2, dtype=torch.float32) / ROTARY_DIM)
    angles = positions.cpu().float()[:, None] * inv_freq[None, :]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x = x.detach().cpu().float()
    x1, x2 = x[..., : ROTARY_DIM // 2], x[..., ROTARY_DIM // 2 : ROTARY_DIM]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., ROTARY_DIM:]], dim=-1)


def check(rope: RotaryEmbedding, dtype, device, tolerance: dict) -> tuple:
    fused, q, k = qkv(dtype, device)
    before = fused.clone()
    positions = torch.tensor(POSITIONS, device=device)
    expected_q, expected_k = direct(q, positions), direct(k, positions)
    out_q, out_k = rope(positions, q, k)
    assert out_q.shape == q.shape and out_k.shape == k.shape
    torch.testing.assert_close(out_q.cpu().float(), expected_q, **tolerance)
    torch.testing.assert_close(out_k.cpu().float(), expected_k, **tolerance)
    # The dims past ROTARY_DIM pass through untouched, and so does v.
    q_end, k_end = HEADS * HEAD_SIZE, (HEADS + KV_HEADS) * HEAD_SIZE
    assert torch.equal(out_q[..., ROTARY_DIM:], before[:, :q_end].view_as(q)[..., ROTARY_DIM:])
    assert torch.equal(out_k[..., ROTARY_DIM:], before[:, q_end:k_end].view_as(k)[..., ROTARY_DIM:])
    assert torch.equal(fused[:, k_end:], before[:, k_end:])
    return q, k, out_q, out_k


def test_reference_rotates_the_leading_dims_only():
    rope = RotaryEmbedding(HEAD_SIZE, 128, BASE, None, ops=reference_layer_ops(), rotary_dim=ROTARY_DIM)
    assert rope.cos_sin_cache.shape == (128, ROTARY_DIM) and rope.is_partial and not rope.fusable
    check(rope, torch.float32, torch.device("cpu"), dict(atol=1e-5, rtol=1e-5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_triton_kernel_rotates_the_leading_dims_in_place(dtype, device):
    ops = dataclasses.replace(reference_layer_ops(), rotary_embedding=apply_rotary)
    rope = RotaryEmbedding(HEAD_SIZE, 128, BASE, None, ops=ops, rotary_dim=ROTARY_DIM).to(device)
    tolerance = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    q, k, out_q, out_k = check(rope, dtype, device, tolerance)
    assert out_q is q and out_k is k  # the kernel rotated the views in place: nothing copied back


def test_rotary_dim_is_checked():
    with pytest.raises(UnsupportedModelError, match="rotary_dim 7"):
        RotaryEmbedding(HEAD_SIZE, 16, BASE, None, rotary_dim=7)
    assert not RotaryEmbedding(HEAD_SIZE, 16, BASE, None, rotary_dim=HEAD_SIZE).is_partial


def test_phi4_mini_on_the_triton_path_matches_reference(family_dir, make_llm, monkeypatch, sandbox):
    """Triton's rotary kernel on the partial views, the unfused KV write."""
    import octavo.kernels.rotary as rotary_kernels
    from octavo import SamplingParams
    from octavo.models.config import load_arch_config
    from octavo.plugins.manager import reset_plugin_manager
    from octavo.runtime.attention.triton_paged import TritonPagedAttention
    from tests.kernels.triton_on_cpu import add_triton_on_cpu, count_calls
    from tests.models.test_hf_parity import make_prompts

    path = family_dir("phi4_mini")
    prompts = [{"prompt_token_ids": p} for p in make_prompts(load_arch_config(path).vocab_size)[:2]]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=1)
    reference = make_llm(path, max_num_seqs=2).generate(prompts, params)
    calls = count_calls(monkeypatch, rotary_kernels, ("apply_rotary", "rotary_and_cache"))
    add_triton_on_cpu(sandbox, ops=("rotary_embedding", "rotary_and_cache"))
    reset_plugin_manager()
    monkeypatch.setenv("OCTAVO_ATTENTION_BACKEND", "triton_paged")
    fused = []
    original = TritonPagedAttention.forward_with_rotary
    monkeypatch.setattr(
        TritonPagedAttention, "forward_with_rotary", lambda self, *a: fused.append(1) or original(self, *a)
    )
    llm = make_llm(path, max_num_seqs=2, enforce_eager=True)
    assert llm.engine.executor.worker.runner.loaded.ops.choice("rotary_embedding").impl == "triton"
    outputs = llm.generate(prompts, params)
    assert calls["apply_rotary"] > 0 and calls["rotary_and_cache"] == 0 and not fused
    for ours, ref in zip(outputs, reference):
        ours, ref = ours.outputs[0], ref.outputs[0]
        assert ours.token_ids == ref.token_ids
        for token, entry, expected in zip(ours.token_ids, ours.logprobs, ref.logprobs):
            assert abs(entry[token].logprob - expected[token].logprob) < 1e-4
