"""torch_paged's decode path (torch_decode.py) against its general path.

Decode steps of one and of several requests (contexts of different lengths:
the mask; padding tokens after the requests: zero rows), grouped-query
heads, a sliding window with logit soft-capping, and KV-cache scales.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from octavo.core.attention import AttentionSpec
from octavo.runtime.attention.torch_paged import TorchPagedAttention
from tests.kernels.batches import BatchSpec, decode_requests, make_batch, mixed_requests


def _spec(batch_spec: BatchSpec, **options) -> AttentionSpec:
    return AttentionSpec(
        num_heads=batch_spec.num_heads, num_kv_heads=batch_spec.num_kv_heads, head_size=batch_spec.head_size,
        scale=batch_spec.head_size**-0.5, dtype=batch_spec.dtype, kv_cache_dtype=batch_spec.dtype,
        block_size=batch_spec.block_size, **options,
    )


def _both_paths(batch_spec: BatchSpec, scales=(1.0, 1.0), **options):
    batch = make_batch(batch_spec, torch.device("cpu"))
    backend = TorchPagedAttention(_spec(batch_spec, **options))
    backend.k_scale, backend.v_scale = scales
    metadata = backend.build_metadata(batch.attn_batch)
    assert metadata.decode is not None
    general = dataclasses.replace(metadata, decode=None, _masks={})
    outputs = []
    for meta in (metadata, general):
        cache = batch.kv_cache.clone()
        outputs.append(backend.forward(batch.query, batch.key, batch.value, cache, meta))
    return outputs


@pytest.mark.parametrize(
    "seq_lens,padding", [([130], 0), ([37, 16, 64, 1], 0), ([37, 16, 5], 1)], ids=["batch1", "ragged", "padded"]
)
def test_decode_path_matches_the_general_path(seq_lens, padding):
    fast, general = _both_paths(BatchSpec(decode_requests(seq_lens), num_heads=6, num_kv_heads=2, num_padding_tokens=padding))
    torch.testing.assert_close(fast, general, atol=1e-5, rtol=1e-5)
    assert fast.shape == general.shape and not fast[len(seq_lens):].any()


def test_window_soft_cap_and_scales():
    batch_spec = BatchSpec(decode_requests([50, 9, 33]), num_heads=4, num_kv_heads=1, head_size=64)
    fast, general = _both_paths(batch_spec, scales=(0.5, 2.0), sliding_window=12, logits_soft_cap=1.5)
    torch.testing.assert_close(fast, general, atol=1e-5, rtol=1e-5)


def test_only_single_token_steps_take_the_decode_path():
    batch = make_batch(BatchSpec(mixed_requests()), torch.device("cpu"))
    backend = TorchPagedAttention(_spec(BatchSpec(mixed_requests())))
    assert backend.build_metadata(batch.attn_batch).decode is None
