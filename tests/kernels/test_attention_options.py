"""What Gemma needs from the attention backends: logit soft-capping, head
size 256 and a sliding window on some layers only.

The Triton kernels (mixed-batch and split-KV decode, under the interpreter
on the CPU) against the plain reference; the torch and static-shape
backends against the same reference; and selection refusing a backend that
does not declare soft-capping for a model that needs it.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from octavo.core.attention import backend_refusal  # noqa: E402
from octavo.kernels.paged_attention import AttentionParams, PagedBatch, paged_attention, tiles_for  # noqa: E402
from octavo.kernels.reference import paged_attention_reference, reshape_and_cache_reference  # noqa: E402
from octavo.kernels.split_kv_decode import SplitWorkspace, split_kv_decode  # noqa: E402
from octavo.runtime.attention.static_paged import StaticPagedAttention  # noqa: E402
from octavo.runtime.attention.torch_paged import TorchPagedAttention  # noqa: E402
from tests.kernels.batches import BatchSpec, decode_requests, make_batch, mixed_requests  # noqa: E402
from tests.kernels.test_triton_backend import attention_spec  # noqa: E402

SOFT_CAP = 1.5  # small, so that capping changes the scores a lot


def _reference(batch, scale, window, soft_cap):
    b = batch.attn_batch
    return paged_attention_reference(
        batch.query, batch.kv_cache, b.query_start_loc, b.seq_lens, b.block_table, scale, window, soft_cap
    )


@pytest.mark.parametrize(
    "head_size,window,soft_cap", [(256, None, None), (256, 8, SOFT_CAP), (32, None, SOFT_CAP)],
    ids=["head256", "head256-window-cap", "cap"],
)
def test_mixed_batch_kernel(head_size, window, soft_cap, device):
    batch = make_batch(BatchSpec(mixed_requests()[:4], num_heads=4, head_size=head_size, num_padding_tokens=2), device)
    b = batch.attn_batch
    reshape_and_cache_reference(batch.key, batch.value, batch.kv_cache, b.slot_mapping)
    scale = 24**-0.5
    paged = PagedBatch(b.query_start_loc, b.seq_lens, b.block_table, b.num_reqs)
    params = AttentionParams(scale, window, soft_cap)
    out = paged_attention(batch.query, batch.kv_cache, paged, params, tiles_for(b.max_query_len, head_size))
    expected = _reference(batch, scale, window, soft_cap)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)
    if soft_cap is not None:  # the cap made a difference
        assert not torch.allclose(expected, _reference(batch, scale, window, None), atol=1e-3)


@pytest.mark.parametrize("num_splits", [1, 2])
def test_split_decode_kernel(num_splits, device):
    spec = BatchSpec(decode_requests([150, 7, 64]), num_heads=4, head_size=256, num_padding_tokens=1)
    batch = make_batch(spec, device)
    b = batch.attn_batch
    reshape_and_cache_reference(batch.key, batch.value, batch.kv_cache, b.slot_mapping)
    paged = PagedBatch(b.query_start_loc, b.seq_lens, b.block_table, b.num_reqs)
    workspace = SplitWorkspace.allocate(*batch.query.shape, num_splits, device) if num_splits > 1 else None
    out = split_kv_decode(batch.query, batch.kv_cache, paged, AttentionParams(0.1, 32, SOFT_CAP), workspace)
    torch.testing.assert_close(out, _reference(batch, 0.1, 32, SOFT_CAP), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("backend_class", [TorchPagedAttention, StaticPagedAttention])
def test_torch_backends(backend_class, device):
    batch_spec = BatchSpec(mixed_requests(), num_heads=4, head_size=256, num_padding_tokens=2)
    batch = make_batch(batch_spec, device)
    spec = dataclasses.replace(attention_spec(batch_spec, sliding_window=12), logits_soft_cap=SOFT_CAP)
    backend = backend_class(spec)
    cache = batch.kv_cache.clone()
    out = backend.forward(batch.query, batch.key, batch.value, cache, backend.build_metadata(batch.attn_batch))
    reshape_and_cache_reference(batch.key, batch.value, batch.kv_cache, batch.attn_batch.slot_mapping)
    expected = _reference(batch, spec.scale, 12, SOFT_CAP)
    n = batch.num_actual_tokens
    torch.testing.assert_close(out[:n], expected[:n], atol=2e-5, rtol=2e-5)


def test_backend_without_soft_cap_is_refused():
    class Older(TorchPagedAttention):
        supports_logits_soft_cap = False

    spec = attention_spec(BatchSpec(mixed_requests()))
    assert backend_refusal(Older, spec) is None
    assert backend_refusal(Older, dataclasses.replace(spec, logits_soft_cap=30.0)) == "no logit soft-capping"
