"""``triton_sdpa_prefill``: one long prompt's attention through torch's fused
kernels (``sdpa_parts``), against the plain reference, and every other step
left to ``triton_paged``. The threshold is lowered so that small shapes
take the long-prompt path."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels.reference import paged_attention_reference  # noqa: E402
from octavo.runtime.attention import triton_sdpa_prefill  # noqa: E402
from octavo.kernels.attention_merge import merge_attention_parts  # noqa: E402
from octavo.kernels.reference import merge_attention_parts_reference  # noqa: E402
from octavo.runtime.attention.sdpa_parts import attention_with_lse  # noqa: E402
from octavo.runtime.attention.triton_sdpa_prefill import TritonSdpaPrefillAttention  # noqa: E402
from tests.kernels.batches import BatchSpec, RequestShape, make_batch  # noqa: E402
from tests.kernels.test_triton_backend import attention_spec  # noqa: E402


@pytest.fixture
def short_threshold(monkeypatch):
    monkeypatch.setattr(triton_sdpa_prefill, "WHOLE_PROMPT_MIN_TOKENS", 40)
    monkeypatch.setattr(triton_sdpa_prefill, "CHUNK_MIN_TOKENS", 40)


def _run(spec: BatchSpec, device, **spec_changes):
    """(the backend's output for the real tokens, the reference's, its metadata). On a GPU
    in bfloat16 (its fused kernels take 16-bit inputs), the reference in float32."""
    import dataclasses

    if device.type != "cpu":
        spec = dataclasses.replace(spec, dtype=torch.bfloat16)
    batch = make_batch(spec, device)
    backend = TritonSdpaPrefillAttention(dataclasses.replace(attention_spec(spec), **spec_changes))
    metadata = backend.build_metadata(batch.attn_batch)
    cache = batch.kv_cache.clone()
    out = backend.forward(batch.query, batch.key, batch.value, cache, metadata)
    b = batch.attn_batch
    expected = paged_attention_reference(
        batch.query.float(), cache.float(), b.query_start_loc, b.seq_lens, b.block_table, backend.spec.scale
    ).to(out.dtype)
    n = batch.num_actual_tokens
    if out.shape[0] > n:
        assert out[n:].abs().max() == 0  # padding rows
    return out[:n], expected[:n], metadata


def _tolerance(out: torch.Tensor) -> dict:
    return dict(atol=2e-5, rtol=2e-5) if out.dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("seq_len,query_len", [(70, 70), (130, 50), (96, 41)])
def test_long_prompt_matches_the_reference(short_threshold, device, seq_len, query_len):
    """A whole prompt (square causal) and chunks after cached context (two parts
    merged by their log-sum-exps), GQA heads, a partial last block, padding tokens."""
    spec = BatchSpec([RequestShape(seq_len, query_len)], num_padding_tokens=3)
    out, expected, metadata = _run(spec, device)
    assert metadata.long_prompt == triton_sdpa_prefill.LongPrompt(0, 0, query_len, seq_len)
    torch.testing.assert_close(out, expected, **_tolerance(out))


@pytest.mark.parametrize("long_request", [RequestShape(70, 70), RequestShape(130, 50)])
@pytest.mark.parametrize("position", [0, 2, 4])
def test_a_long_prompt_beside_other_requests(short_threshold, device, long_request, position):
    """Decodes and a short prefill around the long prompt: they take the Triton
    kernel (which skips the long one's rows), the long one the fused kernels;
    all match the reference."""
    others = [RequestShape(33, 1), RequestShape(90, 1), RequestShape(20, 12), RequestShape(64, 1)]
    requests = others[:position] + [long_request] + others[position:]
    out, expected, metadata = _run(BatchSpec(requests, num_padding_tokens=2), device)
    token_start = sum(r.query_len for r in requests[:position])
    expected_prompt = triton_sdpa_prefill.LongPrompt(position, token_start, long_request.query_len, long_request.seq_len)
    assert metadata.long_prompt == expected_prompt
    torch.testing.assert_close(out, expected, **_tolerance(out))


@pytest.mark.parametrize(
    "requests,changes",
    [
        ([RequestShape(30, 30)], {}),  # shorter than the threshold
        ([RequestShape(90, 39)], {}),  # a chunk shorter than its threshold
        ([RequestShape(60, 39), RequestShape(50, 39)], {}),  # several, none long enough
        ([RequestShape(60, 60)], {"sliding_window": 16}),
        ([RequestShape(60, 60)], {"logits_soft_cap": 30.0}),
    ],
)
def test_other_steps_take_the_triton_kernels(short_threshold, device, requests, changes):
    out, expected, metadata = _run(BatchSpec(requests), device, **changes)
    assert metadata.long_prompt is None
    if not changes:  # the reference has no window or cap: the choice is what is checked there
        torch.testing.assert_close(out, expected, **_tolerance(out))


def test_head_sizes_the_fused_kernels_lack_take_the_triton_kernels(short_threshold, device):
    out, expected, metadata = _run(BatchSpec([RequestShape(60, 60)], head_size=36), device)
    assert metadata.long_prompt is None
    torch.testing.assert_close(out, expected, **_tolerance(out))


def test_merge_of_two_parts_is_the_softmax_over_their_union(device):
    """Keys split anywhere: the merged parts (the kernel and its reference)
    equal attention over all of them, written token-major."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, n, 16, generator=generator).to(device) for h, n in ((4, 9), (2, 21), (2, 21)))
    full_k, full_v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    mask = torch.ones(9, 21, dtype=torch.bool, device=device).tril(diagonal=12)  # the last 9 of 21 positions
    expected = torch.nn.functional.scaled_dot_product_attention(q, full_k, full_v, attn_mask=mask, scale=0.25)
    expected = expected[0].transpose(0, 1)
    parts = [attention_with_lse(q.cpu(), k[:, :, s].cpu(), v[:, :, s].cpu(), 0.25, causal=c)
             for s, c in ((slice(0, 12), False), (slice(12, 21), True))]
    parts = [(out[0].to(device), lse[0].to(device)) for out, lse in parts]
    torch.testing.assert_close(merge_attention_parts_reference(*parts), expected, atol=1e-5, rtol=1e-5)
    out = torch.full((9, 4, 16), float("nan"), device=device)
    torch.testing.assert_close(merge_attention_parts(*parts, out), expected, atol=1e-5, rtol=1e-5)


def test_merge_kernel_weighs_empty_parts_zero(device):
    """Rows with no key in one part (log-sum-exp -inf) take the other's output;
    rows with none in either are zeros; bf16 parts into a bf16 output, partial tiles."""
    generator = torch.Generator().manual_seed(1)
    out_a, out_b = (torch.randn(3, 37, 24, generator=generator).to(device, torch.bfloat16) for _ in range(2))
    lse_a, lse_b = (torch.randn(3, 37, generator=generator).to(device) for _ in range(2))
    lse_a[:, :5] = float("-inf")
    lse_b[:, 3:8] = float("-inf")
    out = torch.empty(37, 3, 24, dtype=torch.bfloat16, device=device)
    out = merge_attention_parts((out_a, lse_a), (out_b, lse_b), out)
    expected = merge_attention_parts_reference((out_a, lse_a), (out_b, lse_b))
    torch.testing.assert_close(out.float(), expected, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(out[:3].float(), out_b[:, :3].transpose(0, 1).float())
    assert out[3:5].abs().max() == 0
    torch.testing.assert_close(out[5:8].float(), out_a[:, 5:8].transpose(0, 1).float())


def test_rotary_fused_step_matches_triton_paged(short_threshold, device):
    """Through ``forward_with_rotary`` (as the model calls it): the same cache and,
    within float32 rounding, the same output as the Triton kernels."""
    from octavo.kernels.rotary import rotary_and_cache
    from octavo.models.layers.rotary import RotaryEmbedding
    from octavo.runtime.attention.triton_paged import TritonPagedAttention

    spec = BatchSpec([RequestShape(100, 60)], num_padding_tokens=2)
    batch = make_batch(spec, device)
    positions = torch.cat([torch.arange(40, 100), torch.zeros(2, dtype=torch.int64)]).to(device)
    cos_sin = RotaryEmbedding(spec.head_size, 128, 10000.0, None).cos_sin_cache.to(device)
    results = []
    for backend_class in (TritonPagedAttention, TritonSdpaPrefillAttention):
        backend = backend_class(attention_spec(spec))
        cache = batch.kv_cache.clone()
        out = backend.forward_with_rotary(
            batch.query.clone(), batch.key.clone(), batch.value, cache, backend.build_metadata(batch.attn_batch),
            positions, cos_sin, rotary_and_cache,
        )
        results.append((out, cache))
    assert torch.equal(results[0][1], results[1][1])
    torch.testing.assert_close(results[1][0], results[0][0], atol=2e-5, rtol=2e-5)


def test_the_first_fused_kernel_that_runs_is_kept(monkeypatch):
    """Off the CPU: cuDNN with grouped KV heads first, then repeated heads, then
    FlashAttention-2; the route that ran is kept for the shape's kind, and when
    every route fails the last error propagates (meta tensors: no kernel runs)."""
    from octavo.runtime.attention import sdpa_parts

    calls = []

    def run_route(route, q, k, v, scale, causal):
        calls.append(route)
        if route == "cudnn" or failing:
            raise RuntimeError(f"{route} refused")
        return q, q[..., 0]

    monkeypatch.setattr(sdpa_parts, "_run_route", run_route)
    monkeypatch.setattr(sdpa_parts, "_ROUTE_TAKEN", {})
    failing = False
    q, k = torch.empty(1, 4, 8, 16, device="meta"), torch.empty(1, 2, 8, 16, device="meta")
    attention_with_lse(q, k, k, 1.0, causal=True)
    attention_with_lse(q, k, k, 1.0, causal=False)
    assert calls == ["cudnn", "cudnn_repeated", "cudnn_repeated"]
    failing = True
    with pytest.raises(RuntimeError, match="efficient_repeated refused"):
        attention_with_lse(q, q, q, 1.0, causal=True)  # a new kind (no grouped heads): cudnn, flash, efficient
    assert calls[3:] == ["cudnn", "flash_repeated", "efficient_repeated"]
