"""GPU variants of the kernel tests at real shapes (Llama-3.1-8B attention:
32 query heads, 8 KV heads, head size 128, bfloat16, blocks of 16 tokens;
contexts of 2k-8k tokens), plus CUDA-graph capture and replay of the
backend's forward with refilled batch tensors. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (GPU-shape kernel tests)"),
]

BF16 = dict(atol=2e-2, rtol=2e-2)
LLAMA_8B = dict(num_heads=32, num_kv_heads=8, head_size=128, dtype=torch.bfloat16, block_size=16)


def _imports():
    from tests.kernels import batches

    return batches


def test_gpu_mixed_batch_llama8b():
    from octavo.kernels.paged_attention import PREFILL_TILES, AttentionParams, PagedBatch, paged_attention
    from octavo.kernels.reference import paged_attention_reference, reshape_and_cache_reference

    b = _imports()
    requests = [
        b.RequestShape(seq_len=2048, query_len=1),
        b.RequestShape(seq_len=8000, query_len=1),
        b.RequestShape(seq_len=1500, query_len=1500),
        b.RequestShape(seq_len=4096, query_len=512),
        b.RequestShape(seq_len=3000, query_len=100, share_prefix_with=3, num_shared_blocks=100),
    ]
    batch = b.make_batch(b.BatchSpec(requests, num_padding_tokens=5, **LLAMA_8B), torch.device("cuda"))
    ab = batch.attn_batch
    reshape_and_cache_reference(batch.key, batch.value, batch.kv_cache, ab.slot_mapping)
    paged = PagedBatch(ab.query_start_loc, ab.seq_lens, ab.block_table, ab.num_reqs)
    for window in (None, 1024):
        out = paged_attention(batch.query, batch.kv_cache, paged, AttentionParams(128**-0.5, window), PREFILL_TILES)
        expected = paged_attention_reference(
            batch.query, batch.kv_cache, ab.query_start_loc, ab.seq_lens, ab.block_table, 128**-0.5, window
        )
        torch.testing.assert_close(out, expected, **BF16)


@pytest.mark.parametrize("num_splits", [1, 8, 32])
def test_gpu_split_decode_long_contexts(num_splits):
    from octavo.kernels.paged_attention import AttentionParams, PagedBatch
    from octavo.kernels.reference import paged_attention_reference
    from octavo.kernels.split_kv_decode import SplitWorkspace, split_kv_decode

    b = _imports()
    batch = b.make_batch(b.BatchSpec(b.decode_requests([8192, 2048, 5000, 17]), **LLAMA_8B), torch.device("cuda"))
    ab = batch.attn_batch
    paged = PagedBatch(ab.query_start_loc, ab.seq_lens, ab.block_table, ab.num_reqs)
    workspace = SplitWorkspace.allocate(4, 32, 128, num_splits, "cuda")
    out = split_kv_decode(batch.query, batch.kv_cache, paged, AttentionParams(128**-0.5), workspace)
    expected = paged_attention_reference(batch.query, batch.kv_cache, ab.query_start_loc, ab.seq_lens, ab.block_table, 128**-0.5)
    torch.testing.assert_close(out, expected, **BF16)


def test_gpu_layer_ops_llama8b():
    from octavo.kernels.activation import silu_and_mul
    from octavo.kernels.reference import apply_rotary_reference, rms_norm_reference, silu_and_mul_reference
    from octavo.kernels.rms_norm import fused_add_rms_norm, rms_norm
    from octavo.kernels.rotary import apply_rotary
    from octavo.models.layers.rotary import RotaryEmbedding

    x = torch.randn(300, 4096, device="cuda", dtype=torch.bfloat16)
    residual = torch.randn_like(x)
    weight = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(rms_norm(x, weight, 1e-5), rms_norm_reference(x, weight, 1e-5), **BF16)
    normed, summed = fused_add_rms_norm(x, residual, weight, 1e-5)
    assert torch.equal(summed, x + residual)
    torch.testing.assert_close(normed, rms_norm_reference(x + residual, weight, 1e-5), **BF16)
    gate_up = torch.randn(300, 2 * 14336, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(silu_and_mul(gate_up), silu_and_mul_reference(gate_up), **BF16)
    rope = RotaryEmbedding(128, 8192, 500000.0, None).cuda()
    qkv = torch.randn(300, 48 * 128, device="cuda", dtype=torch.bfloat16)
    q, k = qkv[:, : 32 * 128].view(300, 32, 128), qkv[:, 32 * 128 : 40 * 128].view(300, 8, 128)
    positions = torch.randint(0, 8192, (300,), device="cuda")
    expected_q, expected_k = apply_rotary_reference(positions, q.clone(), k.clone(), rope.cos_sin_cache)
    out_q, out_k = apply_rotary(positions, q, k, rope.cos_sin_cache)
    torch.testing.assert_close(out_q, expected_q, **BF16)
    torch.testing.assert_close(out_k, expected_k, **BF16)


@pytest.mark.parametrize("min_split_seq_len", [1, 10**9], ids=["split-decode", "one-launch"])
def test_gpu_backend_graph_replay_with_refilled_batch(min_split_seq_len):
    """Capture forward once for 4 decode rows + 2 padding tokens, then refill
    the batch tensors with other contexts and replay: outputs match the torch
    backend run eagerly on the same inputs."""
    from octavo.core.attention import AttentionSpec
    from octavo.runtime.attention.torch_paged import TorchPagedAttention
    from octavo.runtime.attention.triton_paged import TritonPagedAttention
    from octavo.runtime.attention.triton_plan import SplitKvPolicy

    b = _imports()
    device = torch.device("cuda")
    spec = AttentionSpec(32, 8, 128, 128**-0.5, torch.bfloat16, torch.bfloat16, 16)
    backend = TritonPagedAttention(spec, SplitKvPolicy(min_seq_len=min_split_seq_len))
    first = b.make_batch(b.BatchSpec(b.decode_requests([300, 20, 4000, 9]), num_padding_tokens=2, seed=1, **LLAMA_8B), device)
    second = b.make_batch(b.BatchSpec(b.decode_requests([7000, 1, 64, 2500]), num_padding_tokens=2, seed=2, **LLAMA_8B), device)
    # One cache big enough for both; the second batch's block ids index it too.
    kv_cache = torch.zeros_like(second.kv_cache if second.kv_cache.shape[1] > first.kv_cache.shape[1] else first.kv_cache)
    static = b.make_batch(b.BatchSpec(b.decode_requests([300, 20, 4000, 9]), num_padding_tokens=2, seed=1, **LLAMA_8B), device)
    width = max(first.attn_batch.block_table.shape[1], second.attn_batch.block_table.shape[1])
    static_table = torch.zeros(4, width, dtype=torch.int32, device=device)
    static.attn_batch.block_table = static_table
    static.attn_batch.max_seq_len = 8192  # capture for contexts up to 8k

    def refill(src):
        static.query.copy_(src.query)
        static.key.copy_(src.key)
        static.value.copy_(src.value)
        static.attn_batch.seq_lens.copy_(src.attn_batch.seq_lens)
        static.attn_batch.slot_mapping.copy_(src.attn_batch.slot_mapping)
        static_table.zero_()
        static_table[:, : src.attn_batch.block_table.shape[1]] = src.attn_batch.block_table
        kv_cache[:, : src.kv_cache.shape[1]] = src.kv_cache

    refill(first)
    metadata = backend.build_metadata(static.attn_batch)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        backend.forward(static.query, static.key, static.value, kv_cache.clone(), metadata)  # compile outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = backend.forward(static.query, static.key, static.value, kv_cache, metadata)

    for src in (first, second):
        refill(src)
        expected_cache = kv_cache.clone()
        reference = TorchPagedAttention(spec)
        expected = reference.forward(
            src.query, src.key, src.value, expected_cache, reference.build_metadata(src.attn_batch)
        )
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(static_out[:4], expected[:4], **BF16)
        assert torch.isfinite(static_out).all()
        assert torch.equal(kv_cache, expected_cache)


@pytest.mark.parametrize("num_tokens", [1, 2, 4, 8])
def test_gpu_gemv_llama8b_shapes(num_tokens):
    import torch.nn.functional as F

    from octavo.kernels.gemv import gemv
    from octavo.kernels.reference import silu_and_mul_reference

    generator = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(num_tokens, 4096, device="cuda", generator=generator).to(torch.bfloat16)
    for out_features, in_features in ((6144, 4096), (4096, 14336)):
        weight = torch.randn(out_features, in_features, device="cuda", generator=generator).to(torch.bfloat16) * 0.02
        x_in = torch.randn(num_tokens, in_features, device="cuda", generator=generator).to(torch.bfloat16)
        torch.testing.assert_close(gemv(x_in, weight), F.linear(x_in, weight), **BF16)
    gate_up = torch.randn(2 * 14336, 4096, device="cuda", generator=generator).to(torch.bfloat16) * 0.02
    expected = silu_and_mul_reference(F.linear(x, gate_up))
    torch.testing.assert_close(gemv(x, gate_up, silu_mul=True), expected, **BF16)


def test_gpu_gemma2_fused_geglu_and_sandwich_norm():
    # Gemma-2-9B: 3,584 inputs (not a multiple of the 2,048-wide K tile),
    # GeGLU gate-up 2 x 14,336; the sandwich norm's bf16 sum within an ulp,
    # its second norm checked on the kernel's own sum.
    import torch.nn.functional as F

    from octavo.kernels.gemv import gemv_gelu_tanh_mul
    from octavo.kernels.rms_norm import post_norm_add_rms_norm_f32_scale
    from octavo.ops import reference

    generator = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(1, 3584, device="cuda", generator=generator).to(torch.bfloat16)
    gate_up = torch.randn(2 * 14336, 3584, device="cuda", generator=generator).to(torch.bfloat16) * 0.02
    expected = reference.gelu_tanh_and_mul(F.linear(x, gate_up))
    torch.testing.assert_close(gemv_gelu_tanh_mul(x, gate_up, None), expected, **BF16)
    out, residual = (torch.randn(1, 3584, device="cuda", generator=generator).to(torch.bfloat16) * s for s in (30, 3))
    post_weight, weight = (torch.randn(3584, device="cuda", generator=generator).to(torch.bfloat16) for _ in range(2))
    normed, summed = post_norm_add_rms_norm_f32_scale(out, residual, post_weight, weight, 1e-6, 1.0)
    _, expected_sum = reference.post_norm_add_rms_norm_f32_scale(out, residual, post_weight, weight, 1e-6, 1.0)
    torch.testing.assert_close(summed, expected_sum, atol=2**-4, rtol=2**-6)  # an ulp of the normed values (up to 16)
    torch.testing.assert_close(normed, reference.rms_norm_f32_scale(summed, weight, 1e-6, 1.0), atol=0, rtol=2**-7)
