"""The mixed-batch paged attention kernel against the plain-torch reference."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels.paged_attention import (  # noqa: E402
    DECODE_TILES,
    PREFILL_TILES,
    AttentionParams,
    PagedBatch,
    paged_attention,
)
from octavo.kernels.reference import paged_attention_reference, reshape_and_cache_reference  # noqa: E402
from tests.kernels.batches import BatchSpec, RequestShape, make_batch, mixed_requests  # noqa: E402

TOLERANCES = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}


def paged_batch(batch) -> PagedBatch:
    b = batch.attn_batch
    return PagedBatch(b.query_start_loc, b.seq_lens, b.block_table, b.num_reqs)


def run_and_compare(spec: BatchSpec, device, sliding_window=None, tiles=PREFILL_TILES, scale=0.25):
    batch = make_batch(spec, device)
    b = batch.attn_batch
    reshape_and_cache_reference(batch.key, batch.value, batch.kv_cache, b.slot_mapping)
    out = paged_attention(batch.query, batch.kv_cache, paged_batch(batch), AttentionParams(scale, sliding_window), tiles)
    expected = paged_attention_reference(
        batch.query, batch.kv_cache, b.query_start_loc, b.seq_lens, b.block_table, scale, sliding_window
    )
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, **TOLERANCES[spec.dtype])
    return out, batch


@pytest.mark.parametrize("num_heads,num_kv_heads", [(8, 2), (4, 4)], ids=["gqa4", "mha"])
@pytest.mark.parametrize("sliding_window", [None, 8], ids=["full", "window8"])
def test_mixed_batch_matches_reference(num_heads, num_kv_heads, sliding_window, device):
    spec = BatchSpec(mixed_requests(), num_heads=num_heads, num_kv_heads=num_kv_heads, num_padding_tokens=3)
    out, batch = run_and_compare(spec, device, sliding_window)
    # Padding tokens belong to no request: their rows are zeros.
    assert not out[batch.num_actual_tokens :].any()


def test_decode_tiles_on_a_mixed_batch(device):
    # The decode tile shape is only chosen for decode batches, but it must be
    # correct for any batch (a captured graph may see either).
    spec = BatchSpec(mixed_requests()[:3], num_padding_tokens=2)
    run_and_compare(spec, device, tiles=DECODE_TILES)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_precision(dtype, device):
    spec = BatchSpec(mixed_requests()[1:4], dtype=dtype)
    run_and_compare(spec, device)


def test_head_size_64_and_non_power_of_two_group(device):
    # 6 query heads per KV head: the group is padded to 8 rows.
    requests = [RequestShape(seq_len=20, query_len=1), RequestShape(seq_len=33, query_len=12)]
    spec = BatchSpec(requests, num_heads=12, num_kv_heads=2, head_size=64)
    run_and_compare(spec, device, sliding_window=16)


def test_long_prompt_spans_several_query_tiles(device):
    # 150 tokens with 4 query heads per KV head: 10 query tiles of 16 tokens.
    spec = BatchSpec([RequestShape(seq_len=170, query_len=150), RequestShape(seq_len=3, query_len=1)], head_size=16)
    run_and_compare(spec, device)


def test_padded_requests_produce_finite_rows(device):
    # CUDA-graph padding: requests with no context and a slot of -1.
    requests = [RequestShape(seq_len=18, query_len=1), RequestShape(seq_len=9, query_len=1)]
    batch = make_batch(BatchSpec(requests), device)
    b = batch.attn_batch
    reshape_and_cache_reference(batch.key, batch.value, batch.kv_cache, b.slot_mapping)
    padded = PagedBatch(
        torch.tensor([0, 1, 2, 3, 4], dtype=torch.int32, device=device),
        torch.tensor([18, 9, 0, 0], dtype=torch.int32, device=device),
        torch.cat([b.block_table, torch.zeros_like(b.block_table)]),
        num_reqs=4,
    )
    query = torch.cat([batch.query, torch.full_like(batch.query, 7.0)])
    out = paged_attention(query, batch.kv_cache, padded, AttentionParams(0.25), DECODE_TILES)
    expected = paged_attention_reference(batch.query, batch.kv_cache, b.query_start_loc, b.seq_lens, b.block_table, 0.25)
    torch.testing.assert_close(out[:2], expected, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(out).all() and not out[2:].any()


@pytest.mark.parametrize("head_size", [32, 48], ids=["head32", "head48-padded"])
def test_wide_window_masks_only_the_edges(head_size, device):
    # A window of 130 over 300 tokens: masked tiles at both edges of the
    # window, unmasked tiles between (decode row and prefill chunk alike).
    requests = [RequestShape(seq_len=300, query_len=1), RequestShape(seq_len=300, query_len=20)]
    spec = BatchSpec(requests, head_size=head_size, num_padding_tokens=1)
    run_and_compare(spec, device, sliding_window=130)
    run_and_compare(spec, device, sliding_window=None, tiles=DECODE_TILES)
