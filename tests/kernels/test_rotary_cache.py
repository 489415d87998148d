"""The fused rotary + KV-cache write against the unfused kernels (bit for bit)
and the plain-torch references; the Triton backend's ``forward_with_rotary``
against rotary followed by ``forward``; and the tiny Llama through ``LLM`` on
the fused path, token-identical to the torch reference path."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.core.attention import AttentionSpec  # noqa: E402
from octavo.kernels.kv_cache_write import reshape_and_cache  # noqa: E402
from octavo.kernels.reference import apply_rotary_reference, reshape_and_cache_reference  # noqa: E402
from octavo.kernels.rotary import apply_rotary, rotary_and_cache  # noqa: E402
from octavo.models.layers.rotary import RotaryEmbedding  # noqa: E402
from octavo.runtime.attention.triton_paged import TritonPagedAttention  # noqa: E402
from tests.kernels.batches import BatchSpec, make_batch, mixed_requests  # noqa: E402
from tests.plugins.fake_plugins import sandbox  # noqa: E402, F401

NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE, BLOCK_SIZE = 4, 2, 32, 16


def qkv_views(num_tokens, dtype, device, seed=0):
    generator = torch.Generator().manual_seed(seed)
    width = (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_SIZE
    qkv = torch.randn(num_tokens, width, generator=generator).to(device=device, dtype=dtype)
    q = qkv[:, : NUM_HEADS * HEAD_SIZE].view(num_tokens, NUM_HEADS, HEAD_SIZE)
    k = qkv[:, NUM_HEADS * HEAD_SIZE : (NUM_HEADS + NUM_KV_HEADS) * HEAD_SIZE].view(num_tokens, NUM_KV_HEADS, HEAD_SIZE)
    v = qkv[:, (NUM_HEADS + NUM_KV_HEADS) * HEAD_SIZE :].view(num_tokens, NUM_KV_HEADS, HEAD_SIZE)
    return q, k, v


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rotary_and_cache_matches_unfused_kernels(dtype, device):
    rope = RotaryEmbedding(HEAD_SIZE, 128, 10000.0, None)
    cos_sin = rope.cos_sin_cache.to(device)
    positions = torch.tensor([0, 5, 17, 63, 100, 127], device=device)
    slots = torch.tensor([3, 40, -1, 17, 0, 63], device=device)  # -1: padding, nothing written
    q, k, v = qkv_views(6, dtype, device)
    fused_cache = torch.zeros(2, 4, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE, dtype=dtype, device=device)
    plain_cache = fused_cache.clone()
    q_plain, k_plain = q.clone(), k.clone()
    q_before, k_before = q.clone(), k.clone()

    out = rotary_and_cache(positions, q, k, v, cos_sin, fused_cache, slots)
    apply_rotary(positions, q_plain, k_plain, cos_sin)
    reshape_and_cache(k_plain, v, plain_cache, slots)

    assert out.data_ptr() == q.data_ptr() and torch.equal(q, q_plain)
    assert torch.equal(fused_cache, plain_cache)
    assert torch.equal(k, k_before)  # the key tensor itself is not rotated
    ref_q, ref_k = apply_rotary_reference(positions, q_before, k_before, cos_sin)
    ref_cache = torch.zeros_like(fused_cache)
    reshape_and_cache_reference(ref_k, v, ref_cache, slots)
    tolerance = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(q, ref_q, **tolerance)
    torch.testing.assert_close(fused_cache, ref_cache, **tolerance)


def test_backend_forward_with_rotary(device):
    spec = BatchSpec(mixed_requests(), num_padding_tokens=2)
    batch = make_batch(spec, device)
    attn_spec = AttentionSpec(
        batch.query.shape[1], batch.key.shape[1], batch.query.shape[2], 0.25, torch.float32, torch.float32, spec.block_size
    )
    backend = TritonPagedAttention(attn_spec)
    metadata = backend.build_metadata(batch.attn_batch)
    num_tokens = batch.query.shape[0]
    cos_sin = RotaryEmbedding(attn_spec.head_size, 4096, 10000.0, None).cos_sin_cache.to(device)
    positions = torch.randint(0, 4096, (num_tokens,), generator=torch.Generator().manual_seed(1)).to(device)

    fused_cache = batch.kv_cache.clone()
    fused = backend.forward_with_rotary(
        batch.query.clone(), batch.key.clone(), batch.value, fused_cache, metadata, positions, cos_sin, rotary_and_cache
    )
    plain_cache = batch.kv_cache.clone()
    q, k = apply_rotary(positions, batch.query.clone(), batch.key.clone(), cos_sin)
    plain = backend.forward(q, k, batch.value, plain_cache, metadata)
    assert torch.equal(fused_cache, plain_cache)
    assert torch.equal(fused, plain)


def test_llm_on_fused_path_matches_reference(llama_dir, make_llm, monkeypatch, sandbox):
    from octavo import SamplingParams
    from octavo.plugins.manager import reset_plugin_manager
    from tests.kernels.triton_on_cpu import add_triton_on_cpu
    from tests.models.test_hf_parity import make_prompts
    from tests.runtime.test_decode_overlap import vocab

    prompts = [{"prompt_token_ids": p} for p in make_prompts(vocab(llama_dir))[:2]]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    reference = make_llm(llama_dir, max_num_seqs=2).generate(prompts, params)
    add_triton_on_cpu(sandbox)  # Octavo's kernels for the cpu platform, as the cuda platform gets them
    reset_plugin_manager()
    monkeypatch.setenv("OCTAVO_ATTENTION_BACKEND", "triton_paged")
    llm = make_llm(llama_dir, max_num_seqs=2, enforce_eager=True)
    ops = llm.engine.executor.worker.runner.loaded.ops
    assert (ops.choice("rotary_and_cache").impl, ops.choice("rotary_and_cache").plugin) == ("triton", "triton_on_cpu")
    calls = []
    backend_cls = TritonPagedAttention
    original = backend_cls.forward_with_rotary
    monkeypatch.setattr(backend_cls, "forward_with_rotary", lambda self, *a: calls.append(a[-1]) or original(self, *a))
    outputs = llm.generate(prompts, params)
    assert calls and all(op is rotary_and_cache for op in calls)  # the kernel, handed over by the layer
    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in reference]
