"""The attention kernels on an fp8 KV cache with per-layer scales, against
plain torch (under Triton's interpreter on the CPU).

The cache holds ``key * (1 / k_scale)`` rounded to fp8 (e4m3 or e5m2); the
kernels widen it in registers and fold ``k_scale`` into the softmax scale
and ``v_scale`` into the output. Expected values: the torch reference run
on the dequantized cache (``fp8 value * scale`` in float32), so the only
difference is float32 rounding order.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels.kv_cache_write import reshape_and_cache  # noqa: E402
from octavo.kernels.paged_attention import AttentionParams, PagedBatch, paged_attention  # noqa: E402
from octavo.kernels.reference import paged_attention_reference  # noqa: E402
from octavo.kernels.rotary import rotary_and_cache  # noqa: E402
from octavo.kernels.split_kv_decode import SplitWorkspace, split_kv_decode  # noqa: E402
from octavo.ops.reference import rotary_and_cache as rotary_and_cache_reference  # noqa: E402
from octavo.runtime.attention.torch_paged import write_kv_cache  # noqa: E402
from tests.kernels.batches import BatchSpec, RequestShape, decode_requests, make_batch, mixed_requests  # noqa: E402

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
K_SCALE, V_SCALE = 0.5, 3.0


@pytest.mark.parametrize("cache_dtype", FP8, ids=["e4m3", "e5m2"])
def test_reshape_and_cache_fp8_with_scales(cache_dtype, device):
    generator = torch.Generator().manual_seed(0)
    key, value = (torch.randn(7, 2, 32, generator=generator).to(torch.bfloat16).to(device) * 4 for _ in range(2))
    slots = torch.tensor([3, 40, -1, 17, 0, 63, 8], device=device)
    cache = torch.zeros(2, 4, 16, 2, 32, dtype=cache_dtype, device=device)
    expected = cache.clone()
    reshape_and_cache(key, value, cache, slots, K_SCALE, V_SCALE)
    write_kv_cache(key, value, expected, slots, K_SCALE, V_SCALE)
    assert torch.equal(cache.float(), expected.float())


def test_rotary_and_cache_into_fp8(device):
    """The fused rotary + write rounds to fp8 like the reference's cast."""
    from octavo.models.layers.rotary import RotaryEmbedding

    cos_sin = RotaryEmbedding(32, 128, 10000.0, None).cos_sin_cache.to(device)
    positions = torch.tensor([0, 5, 17, 100], device=device)
    slots = torch.tensor([3, -1, 17, 63], device=device)
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(4, h, 32, generator=generator).to(device) for h in (4, 2, 2))
    cache = torch.zeros(2, 4, 16, 2, 32, dtype=torch.float8_e4m3fn, device=device)
    expected = cache.clone()
    rotary_and_cache(positions, q.clone(), k, v, cos_sin, cache, slots)
    rotary_and_cache_reference(positions, q.clone(), k, v, cos_sin, expected, slots)
    # Float32 rotation in both; one fp8 step apart at most where they round a hair apart.
    assert (cache.float() - expected.float()).abs().max() <= 2**-3 * expected.float().abs().max()


def _fp8_batch(spec: BatchSpec, cache_dtype, device):
    """A batch whose cache (context and the step's tokens) is fp8 with scales, and its dequantized twin."""
    batch = make_batch(spec, device)
    write_kv_cache(batch.key, batch.value, batch.kv_cache, batch.attn_batch.slot_mapping)
    scales = torch.tensor([K_SCALE, V_SCALE], device=device).reshape(2, 1, 1, 1, 1)
    fp8_cache = (batch.kv_cache.float() / scales).to(cache_dtype)
    return batch, fp8_cache, fp8_cache.float() * scales


def _expected(batch, dequantized, scale: float) -> torch.Tensor:
    b = batch.attn_batch
    return paged_attention_reference(batch.query, dequantized, b.query_start_loc, b.seq_lens, b.block_table, scale)


@pytest.mark.parametrize("cache_dtype", FP8, ids=["e4m3", "e5m2"])
def test_paged_attention_reads_fp8_with_scales(cache_dtype, device):
    batch, fp8_cache, dequantized = _fp8_batch(BatchSpec(mixed_requests()), cache_dtype, device)
    b = batch.attn_batch
    paged = PagedBatch(b.query_start_loc, b.seq_lens, b.block_table, b.num_reqs)
    out = paged_attention(batch.query, fp8_cache, paged, AttentionParams(0.25, k_scale=K_SCALE, v_scale=V_SCALE))
    torch.testing.assert_close(out, _expected(batch, dequantized, 0.25), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("num_splits", [1, 2])
def test_split_decode_reads_fp8_with_scales(num_splits, device):
    spec = BatchSpec(decode_requests([150, 5, 77]), num_padding_tokens=1)
    batch, fp8_cache, dequantized = _fp8_batch(spec, torch.float8_e4m3fn, device)
    b = batch.attn_batch
    paged = PagedBatch(b.query_start_loc, b.seq_lens, b.block_table, b.num_reqs)
    num_tokens, num_heads, head_size = batch.query.shape
    workspace = None if num_splits == 1 else SplitWorkspace.allocate(num_tokens, num_heads, head_size, num_splits, device)
    params = AttentionParams(0.3, k_scale=K_SCALE, v_scale=V_SCALE)
    out = split_kv_decode(batch.query, fp8_cache, paged, params, workspace)
    torch.testing.assert_close(out, _expected(batch, dequantized, 0.3), atol=1e-5, rtol=1e-5)
    assert not out[batch.num_actual_tokens :].any()


def _fresh_case(spec: BatchSpec, device):
    """An fp8 cache (no scales) holding the context and the step's tokens, and
    what fresh attention should see: the context dequantized, the step's own
    keys and values exact."""
    batch = make_batch(spec, device)
    slots = batch.attn_batch.slot_mapping
    write_kv_cache(batch.key, batch.value, batch.kv_cache, slots)
    fp8_cache = batch.kv_cache.to(torch.float8_e4m3fn)
    seen = fp8_cache.float()
    write_kv_cache(batch.key, batch.value, seen, slots)
    return batch, fp8_cache, seen


@pytest.mark.parametrize("sliding_window", [None, 12], ids=["full", "window12"])
def test_paged_attention_fresh_kv_over_fp8(sliding_window, device):
    """``fresh_kv``: each request's new tokens come from the step's K/V (here
    strided views of one qkv tensor, as the model gives them), the context from
    the fp8 cache; decode rows, a whole prompt, chunks with context, a
    prefix-cache hit and padding rows in one batch; the long chunk's later
    query tiles have windows that start past its context."""
    spec = BatchSpec([*mixed_requests(), RequestShape(seq_len=90, query_len=45)], num_padding_tokens=3)
    batch, fp8_cache, seen = _fresh_case(spec, device)
    qkv = torch.cat([batch.query, batch.key, batch.value], dim=1)  # [T, H + 2 Hkv, D]
    num_heads, num_kv = spec.num_heads, spec.num_kv_heads
    key, value = qkv[:, num_heads : num_heads + num_kv], qkv[:, num_heads + num_kv :]
    b = batch.attn_batch
    paged = PagedBatch(b.query_start_loc, b.seq_lens, b.block_table, b.num_reqs)
    params = AttentionParams(0.25, sliding_window=sliding_window)
    out = paged_attention(batch.query, fp8_cache, paged, params, fresh_kv=(key, value))
    expected = paged_attention_reference(
        batch.query, seen, b.query_start_loc, b.seq_lens, b.block_table, 0.25, sliding_window=sliding_window
    )
    n = batch.num_actual_tokens
    torch.testing.assert_close(out[:n], expected[:n], atol=1e-5, rtol=1e-5)
    assert not out[n:].any()
    # Reading the new tokens back from the cache instead differs (fp8 rounding).
    from_cache = paged_attention(batch.query, fp8_cache, paged, params)
    assert (from_cache[:n] - expected[:n]).abs().max() > 1e-3


def test_fresh_kv_refuses_kv_scales(device):
    batch, fp8_cache, _ = _fresh_case(BatchSpec(mixed_requests()), device)
    b = batch.attn_batch
    paged = PagedBatch(b.query_start_loc, b.seq_lens, b.block_table, b.num_reqs)
    with pytest.raises(ValueError, match="unscaled"):
        params = AttentionParams(0.25, k_scale=K_SCALE)
        paged_attention(batch.query, fp8_cache, paged, params, fresh_kv=(batch.key, batch.value))


def test_fp8_cache_products_in_float16_on_a_gpu(monkeypatch):
    """Over an fp8 cache the products are float16 (exact from either fp8, one
    conversion a pair); elsewhere the activations' dtype; float32 for float32
    inputs and under the interpreter (``dot_dtype``'s rule)."""
    import triton.language as tl

    from octavo.kernels import triton_utils

    monkeypatch.setattr(triton_utils, "interpreting", lambda: False)
    for fp8 in FP8:
        assert triton_utils.cache_dot_dtype(torch.bfloat16, fp8) == tl.float16
        assert triton_utils.cache_dot_dtype(torch.float16, fp8) == tl.float16
    assert triton_utils.cache_dot_dtype(torch.bfloat16, torch.bfloat16) == tl.bfloat16
    assert triton_utils.cache_dot_dtype(torch.float32, torch.float8_e4m3fn) == tl.float32
    monkeypatch.undo()
    assert triton_utils.cache_dot_dtype(torch.bfloat16, torch.float8_e4m3fn) == triton_utils.dot_dtype(torch.bfloat16)
