"""Attention sinks (gpt-oss) in the plain-torch backend, and backend choice.

``TorchPagedAttention`` with ``sinks=`` against the formula written out
token by token: ``softmax([scores, sink])`` without its last column, times
the values. Mixed batches (decode rows, a whole prompt, a chunk after
cached context, a prefix-cache hit, padding tokens) take the general path,
single-token steps the decode path (ragged contexts, grouped-query heads
laid out by KV head); both with and without a sliding window. Then the
choice of backend: one that does not declare ``supports_sinks`` is refused
(never a kernel that would drop them).
"""

from __future__ import annotations

import types

import pytest
import torch

from octavo.core.attention import AttentionSpec, backend_refusal
from octavo.runtime.attention.torch_paged import TorchPagedAttention
from tests.kernels.batches import BatchSpec, MixedBatch, RequestShape, decode_requests, make_batch, mixed_requests


def _spec(batch_spec: BatchSpec, window: int | None = None) -> AttentionSpec:
    return AttentionSpec(
        num_heads=batch_spec.num_heads, num_kv_heads=batch_spec.num_kv_heads, head_size=batch_spec.head_size,
        scale=batch_spec.head_size**-0.5, dtype=batch_spec.dtype, kv_cache_dtype=batch_spec.dtype,
        block_size=batch_spec.block_size, sliding_window=window, sinks=True,
    )


def _context(batch: MixedBatch, request: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[seq_len, Hkv, D] keys and values of a request, read back from the cache (after the step's writes)."""
    block_size = batch.spec.block_size
    table = batch.attn_batch.block_table[request]
    positions = torch.arange(seq_len)
    blocks, offsets = table[positions // block_size].long(), positions % block_size
    return batch.kv_cache[0, blocks, offsets], batch.kv_cache[1, blocks, offsets]


def _expected(batch: MixedBatch, spec: AttentionSpec, sinks: torch.Tensor) -> torch.Tensor:
    """Each query token's output by the formula, one token and head at a time."""
    out = torch.zeros_like(batch.query)
    group = spec.num_heads // spec.num_kv_heads
    starts = batch.attn_batch.query_start_loc.tolist()
    for request, seq_len in enumerate(batch.attn_batch.seq_lens.tolist()):
        keys, values = _context(batch, request, seq_len)
        first, last = starts[request], starts[request + 1]
        for token in range(first, last):
            position = seq_len - (last - token)
            low = 0 if spec.sliding_window is None else max(0, position - spec.sliding_window + 1)
            for head in range(spec.num_heads):
                k, v = keys[low : position + 1, head // group], values[low : position + 1, head // group]
                scores = (k @ batch.query[token, head]) * spec.scale
                probs = torch.softmax(torch.cat([scores, sinks[head : head + 1]]), dim=0)[:-1]
                out[token, head] = probs @ v
    return out


def _run(batch_spec: BatchSpec, window: int | None, decode: bool) -> None:
    batch = make_batch(batch_spec, torch.device("cpu"))
    spec = _spec(batch_spec, window)
    # Large sinks of both signs: from almost no mass to most of it.
    sinks = torch.linspace(-3.0, 3.0, spec.num_heads)
    backend = TorchPagedAttention(spec)
    metadata = backend.build_metadata(batch.attn_batch)
    assert (metadata.decode is not None) == decode
    out = backend.forward(batch.query, batch.key, batch.value, batch.kv_cache, metadata, sinks=sinks)
    expected = _expected(batch, spec, sinks)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    without = backend.forward(batch.query, batch.key, batch.value, batch.kv_cache, metadata)
    assert not torch.allclose(out[: batch.num_actual_tokens], without[: batch.num_actual_tokens], atol=1e-3)


@pytest.mark.parametrize("window", [None, 6], ids=["full", "window"])
def test_mixed_batch_with_sinks(window):
    requests = mixed_requests()
    _run(BatchSpec(requests, num_heads=6, num_kv_heads=2, head_size=16, num_padding_tokens=2), window, decode=False)


@pytest.mark.parametrize("window", [None, 6], ids=["full", "window"])
def test_decode_step_with_sinks(window):
    _run(BatchSpec(decode_requests([37, 5, 16, 1]), num_heads=8, num_kv_heads=2, head_size=16), window, decode=True)


def test_first_token_gives_the_sink_its_share():
    """One key: its weight is ``1 / (1 + exp(sink - score))``, the rest is the sink's."""
    batch_spec = BatchSpec([RequestShape(seq_len=1, query_len=1)], num_heads=2, num_kv_heads=1, head_size=16)
    batch = make_batch(batch_spec, torch.device("cpu"))
    spec = _spec(batch_spec)
    sinks = torch.tensor([0.0, 2.0])
    backend = TorchPagedAttention(spec)
    metadata = backend.build_metadata(batch.attn_batch)
    out = backend.forward(batch.query, batch.key, batch.value, batch.kv_cache, metadata, sinks=sinks)
    scores = (batch.query[0] @ batch.key[0, 0]) * spec.scale
    weight = torch.sigmoid(scores - sinks)
    torch.testing.assert_close(out[0], weight[:, None] * batch.value[0, 0][None, :], atol=1e-6, rtol=1e-6)


def test_backend_choice_with_sinks():
    """The Triton backends take sinks (their kernels, and cuDNN's long-prompt
    path off: tests/kernels/test_attention_sinks_kernels.py); a backend that
    does not declare them is refused."""
    from octavo.platforms.attention_selection import choose_attention_backend
    from octavo.platforms.cuda import CudaPlatform
    from octavo.runtime.attention.static_paged import StaticPagedAttention
    from octavo.runtime.attention.triton_paged import TritonPagedAttention
    from octavo.runtime.attention.triton_sdpa_prefill import TritonSdpaPrefillAttention

    spec = _spec(BatchSpec(mixed_requests(), head_size=64))
    assert backend_refusal(StaticPagedAttention, spec) == "no attention sinks"
    for backend_class in (TorchPagedAttention, TritonPagedAttention, TritonSdpaPrefillAttention):
        assert backend_refusal(backend_class, spec) in (None, "triton is not installed")
    if backend_refusal(TritonSdpaPrefillAttention, spec) is None:
        cuda = types.SimpleNamespace(name="cuda", attention_backends=CudaPlatform.attention_backends)
        assert choose_attention_backend(cuda, spec).backend_class is TritonSdpaPrefillAttention
