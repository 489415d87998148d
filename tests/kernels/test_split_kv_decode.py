"""Split-KV decode (stage 1 + merge) against the plain-torch reference."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels.paged_attention import AttentionParams, PagedBatch  # noqa: E402
from octavo.kernels.reference import paged_attention_reference, reshape_and_cache_reference  # noqa: E402
from octavo.kernels.split_kv_decode import SplitWorkspace, split_kv_decode  # noqa: E402
from tests.kernels.batches import BatchSpec, decode_requests, make_batch  # noqa: E402


def run_split(spec: BatchSpec, num_splits: int, device, sliding_window=None, scale=0.3):
    batch = make_batch(spec, device)
    b = batch.attn_batch
    reshape_and_cache_reference(batch.key, batch.value, batch.kv_cache, b.slot_mapping)
    paged = PagedBatch(b.query_start_loc, b.seq_lens, b.block_table, b.num_reqs)
    num_tokens, num_heads, head_size = batch.query.shape
    workspace = SplitWorkspace.allocate(num_tokens, num_heads, head_size, num_splits, device)
    out = split_kv_decode(batch.query, batch.kv_cache, paged, AttentionParams(scale, sliding_window), workspace)
    expected = paged_attention_reference(
        batch.query, batch.kv_cache, b.query_start_loc, b.seq_lens, b.block_table, scale, sliding_window
    )
    return out, expected, batch


@pytest.mark.parametrize("num_heads,num_kv_heads", [(8, 2), (4, 4)], ids=["gqa4", "mha"])
@pytest.mark.parametrize("num_splits", [1, 2, 4])
def test_split_decode_matches_reference(num_heads, num_kv_heads, num_splits, device):
    spec = BatchSpec(decode_requests([200, 5, 77]), num_heads=num_heads, num_kv_heads=num_kv_heads, num_padding_tokens=2)
    out, expected, batch = run_split(spec, num_splits, device)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert not out[batch.num_actual_tokens :].any()


def test_split_decode_sliding_window_and_empty_splits(device):
    # A context of 5 tokens leaves 7 of 8 splits empty; the window cuts 200 to 40.
    spec = BatchSpec(decode_requests([200, 5]))
    out, expected, _ = run_split(spec, 8, device, sliding_window=40)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_split_decode_bfloat16(device):
    spec = BatchSpec(decode_requests([150, 33]), dtype=torch.bfloat16)
    out, expected, _ = run_split(spec, 4, device)
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)


def test_split_decode_padded_requests_are_zero(device):
    # CUDA-graph padding: two extra requests with no context, slot -1, and
    # one token past every request.
    batch = make_batch(BatchSpec(decode_requests([90, 12])), device)
    b = batch.attn_batch
    reshape_and_cache_reference(batch.key, batch.value, batch.kv_cache, b.slot_mapping)
    padded = PagedBatch(
        torch.tensor([0, 1, 2, 3, 4], dtype=torch.int32, device=device),
        torch.tensor([90, 12, 0, 0], dtype=torch.int32, device=device),
        torch.cat([b.block_table, torch.zeros_like(b.block_table)]),
        num_reqs=4,
    )
    query = torch.cat([batch.query, torch.full((3, *batch.query.shape[1:]), 5.0, device=device)])
    workspace = SplitWorkspace.allocate(5, 8, 32, 4, device)
    out = split_kv_decode(query, batch.kv_cache, padded, AttentionParams(0.3), workspace)
    expected = paged_attention_reference(batch.query, batch.kv_cache, b.query_start_loc, b.seq_lens, b.block_table, 0.3)
    torch.testing.assert_close(out[:2], expected, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(out).all() and not out[2:].any()


@pytest.mark.parametrize("num_heads,num_kv_heads", [(8, 2), (4, 4)], ids=["gqa4", "mha"])
def test_direct_decode_matches_reference(num_heads, num_kv_heads, device):
    # No workspace: one program per (token, KV head), output written directly.
    spec = BatchSpec(decode_requests([200, 5, 77, 1]), num_heads=num_heads, num_kv_heads=num_kv_heads, num_padding_tokens=2)
    batch = make_batch(spec, device)
    b = batch.attn_batch
    reshape_and_cache_reference(batch.key, batch.value, batch.kv_cache, b.slot_mapping)
    paged = PagedBatch(b.query_start_loc, b.seq_lens, b.block_table, b.num_reqs)
    out = split_kv_decode(batch.query, batch.kv_cache, paged, AttentionParams(0.3), None)
    expected = paged_attention_reference(batch.query, batch.kv_cache, b.query_start_loc, b.seq_lens, b.block_table, 0.3)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert not out[batch.num_actual_tokens :].any()


def test_direct_decode_sliding_window_bfloat16(device):
    spec = BatchSpec(decode_requests([150, 33]), dtype=torch.bfloat16)
    batch = make_batch(spec, device)
    b = batch.attn_batch
    reshape_and_cache_reference(batch.key, batch.value, batch.kv_cache, b.slot_mapping)
    paged = PagedBatch(b.query_start_loc, b.seq_lens, b.block_table, b.num_reqs)
    out = split_kv_decode(batch.query, batch.kv_cache, paged, AttentionParams(0.3, sliding_window=40), None)
    expected = paged_attention_reference(
        batch.query, batch.kv_cache, b.query_start_loc, b.seq_lens, b.block_table, 0.3, 40
    )
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)
