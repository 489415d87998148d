"""Attention sinks (gpt-oss) in the Triton kernels, against the torch backend.

``triton_paged`` with ``sinks=`` on the same batches as ``torch_paged``
(whose sink math tests/runtime/test_attention_sinks.py checks against the
formula): the mixed-batch kernel (decode rows, a prompt, a chunk after
context, a prefix-cache hit, padding tokens), and decode by one program per
request and by split-KV with its merge (the sink joins the first split's
partial only), with and without a sliding window; sinks of both signs, large
enough to take most of a row's mass or almost none; and ``triton_sdpa_prefill``
keeping such layers' long prompts off cuDNN's kernels, which have no sinks.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from octavo.runtime.attention.torch_paged import TorchPagedAttention  # noqa: E402
from octavo.runtime.attention.triton_paged import TritonPagedAttention  # noqa: E402
from octavo.runtime.attention.triton_plan import SplitKvPolicy  # noqa: E402
from tests.kernels.batches import BatchSpec, decode_requests, make_batch, mixed_requests  # noqa: E402
from tests.kernels.test_triton_backend import attention_spec  # noqa: E402


def _compare(batch_spec: BatchSpec, device, window=None, split_policy=None):
    batch = make_batch(batch_spec, device)
    spec = dataclasses.replace(attention_spec(batch_spec, window), sinks=True)
    sinks = torch.linspace(-3.0, 3.0, spec.num_heads, device=device)
    reference, triton = TorchPagedAttention(spec), TritonPagedAttention(spec, split_policy)
    meta = triton.build_metadata(batch.attn_batch)
    expected = reference.forward(
        batch.query, batch.key, batch.value, batch.kv_cache.clone(), reference.build_metadata(batch.attn_batch),
        sinks=sinks,
    )
    out = triton.forward(batch.query, batch.key, batch.value, batch.kv_cache.clone(), meta, sinks=sinks)
    num_actual = batch.num_actual_tokens
    torch.testing.assert_close(out[:num_actual], expected[:num_actual], atol=1e-5, rtol=1e-5)
    assert not out[num_actual:].any()  # padding rows stay zero
    return meta


@pytest.mark.parametrize("window", [None, 6], ids=["full", "window"])
def test_mixed_batch_kernel(window, device):
    batch_spec = BatchSpec(mixed_requests(), num_heads=6, num_kv_heads=2, head_size=16, num_padding_tokens=2)
    assert _compare(batch_spec, device, window).max_query_len > 1


@pytest.mark.parametrize("window", [None, 6], ids=["full", "window"])
def test_decode_kernel(window, device):
    batch_spec = BatchSpec(decode_requests([37, 5, 1]), num_heads=4, num_kv_heads=2, head_size=16, num_padding_tokens=1)
    assert _compare(batch_spec, device, window, SplitKvPolicy(min_seq_len=10_000)).num_splits == 1


@pytest.mark.parametrize("window", [None, 40], ids=["full", "window"])
def test_split_kv_decode(window, device):
    # Two splits of 64-key tiles over 130 tokens; with the window, the last 40 fill the first split alone.
    batch_spec = BatchSpec(decode_requests([130, 70]), num_heads=4, num_kv_heads=2, head_size=16, num_padding_tokens=1)
    policy = SplitKvPolicy(min_seq_len=64, min_tokens_per_split=1)
    assert _compare(batch_spec, device, window, policy).num_splits > 1


def test_long_prompts_stay_on_the_triton_kernel():
    """cuDNN's fused kernels have no sinks: ``triton_sdpa_prefill`` never plans a long prompt for such layers."""
    from octavo.runtime.attention.triton_sdpa_prefill import TritonSdpaPrefillAttention

    spec = dataclasses.replace(attention_spec(BatchSpec(mixed_requests(), head_size=64)), sinks=True)
    assert not TritonSdpaPrefillAttention(spec)._fused_kernels_fit
    assert TritonSdpaPrefillAttention(dataclasses.replace(spec, sinks=False))._fused_kernels_fit


def test_gpt_oss_greedy_tokens_match_torch_backend(family_dir, make_llm, monkeypatch, one_thread):
    """The small gpt-oss checkpoint (a sliding and a full layer, sinks) through
    ``triton_paged`` on the CPU platform: chunked prefill, then split-KV decode."""
    from octavo import SamplingParams
    from octavo.platforms.cpu import CpuPlatform

    path = family_dir("gpt_oss")
    prompts = [{"prompt_token_ids": [5, 9, 23, 7, 41, 3, 17, 2, 60, 11]}, {"prompt_token_ids": [12, 8, 30]}]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in make_llm(path).generate(prompts, params)]

    policy = SplitKvPolicy(min_seq_len=1, min_tokens_per_split=1)
    monkeypatch.setattr(CpuPlatform, "attention_backend", lambda self, spec: TritonPagedAttention(spec, policy))
    llm = make_llm(path, max_num_batched_tokens=5)
    attention = llm.engine.executor.worker.runner.model.model.layers[0].self_attn
    assert isinstance(attention.attn.backend, TritonPagedAttention) and attention.sinks is not None
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == expected
