"""Octavo's Triton layer-op kernels (RMSNorm, rotary embedding, gated
activations) against the registry's references (``octavo.ops.reference``)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels.activation import gelu_and_mul, gelu_tanh_and_mul, silu_and_mul  # noqa: E402
from octavo.kernels.reference import (  # noqa: E402
    apply_rotary_reference,
    fused_add_rms_norm_reference,
    rms_norm_reference,
    silu_and_mul_reference,
)
from octavo.kernels.rms_norm import fused_add_rms_norm, qk_rms_norm, rms_norm, rms_norm_f32_scale  # noqa: E402
from octavo.kernels.rotary import apply_rotary  # noqa: E402
from octavo.models.layers.rotary import RotaryEmbedding  # noqa: E402
from octavo.ops import reference  # noqa: E402
from tests.kernels.tolerances import assert_same_rounding  # noqa: E402
from tests.plugins.fake_plugins import sandbox  # noqa: E402, F401

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
IDS = ["fp32", "bf16", "fp16"]
# Half precision: the kernels round once where the reference rounds per op.
TOLERANCES = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2),
}


def randn(*shape, dtype=torch.float32, device="cpu", seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(device)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_rms_norm(dtype, device):
    x = randn(5, 96, dtype=dtype, device=device) * 3
    weight = randn(96, dtype=dtype, device=device, seed=1)
    torch.testing.assert_close(rms_norm(x, weight, 1e-6), rms_norm_reference(x, weight, 1e-6), **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_fused_add_rms_norm(dtype, device):
    x = randn(4, 64, dtype=dtype, device=device)
    residual = randn(4, 64, dtype=dtype, device=device, seed=2)
    weight = randn(64, dtype=dtype, device=device, seed=1)
    normed, summed = fused_add_rms_norm(x, residual, weight, 1e-5)
    expected_normed, expected_summed = fused_add_rms_norm_reference(x, residual, weight, 1e-5)
    assert_same_rounding(summed, expected_summed)  # one rounding of the same float32 sum
    torch.testing.assert_close(normed, expected_normed, **TOLERANCES[dtype])
    assert torch.equal(x, randn(4, 64, dtype=dtype, device=device))  # inputs untouched


def test_rms_norm_on_strided_heads(device):
    # Per-head q norm (Qwen3) on a view of a fused qkv output.
    qkv = randn(3, 4 * 32 + 2 * 2 * 32, device=device)
    q = qkv[:, : 4 * 32].view(3, 4, 32)
    weight = randn(32, device=device, seed=1)
    out = rms_norm(q, weight, 1e-6)
    assert out.shape == (3, 4, 32)
    torch.testing.assert_close(out, rms_norm_reference(q, weight, 1e-6), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("weight_offset", [None, 1.0, 0.0], ids=["llama-rounding", "gemma", "float32-scale"])
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_qk_rms_norm_matches_the_two_norms(weight_offset, dtype, device):
    """Qwen3's / Gemma 3's q and k head norms in one launch, on the qkv row's
    views: the same values as the per-tensor kernel run twice (one rounding
    path), within the op's tolerance of the reference; inputs untouched."""
    heads, kv_heads, head_size, tokens = 6, 2, 64, 3
    qkv = randn(tokens, (heads + 2 * kv_heads) * head_size, dtype=dtype, device=device) * 3
    q, k, _ = qkv.split([heads * head_size, kv_heads * head_size, kv_heads * head_size], dim=-1)
    q, k = q.view(tokens, heads, head_size), k.view(tokens, kv_heads, head_size)
    q_weight, k_weight = randn(head_size, dtype=dtype, device=device, seed=1), randn(head_size, dtype=dtype, device=device, seed=2)
    before = qkv.clone()
    q_out, k_out = qk_rms_norm(q, k, q_weight, k_weight, 1e-6, weight_offset)
    if weight_offset is None:
        one = (rms_norm(q, q_weight, 1e-6), rms_norm(k, k_weight, 1e-6))
    else:
        one = (rms_norm_f32_scale(q, q_weight, 1e-6, weight_offset), rms_norm_f32_scale(k, k_weight, 1e-6, weight_offset))
    assert torch.equal(q_out, one[0]) and torch.equal(k_out, one[1])
    expected = reference.qk_rms_norm(q, k, q_weight, k_weight, 1e-6, weight_offset)
    torch.testing.assert_close(q_out, expected[0], **TOLERANCES[dtype])
    torch.testing.assert_close(k_out, expected[1], **TOLERANCES[dtype])
    assert torch.equal(qkv, before)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_rotary_on_qkv_views(dtype, device):
    num_heads, num_kv_heads, head_size, num_tokens = 4, 2, 32, 6
    rope = RotaryEmbedding(head_size, 128, 10000.0, {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 32})
    cache = rope.cos_sin_cache.to(device)
    qkv = randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_size, dtype=dtype, device=device)
    q = qkv[:, : num_heads * head_size].view(num_tokens, num_heads, head_size)
    k = qkv[:, num_heads * head_size : (num_heads + num_kv_heads) * head_size].view(num_tokens, num_kv_heads, head_size)
    v_before = qkv[:, (num_heads + num_kv_heads) * head_size :].clone()
    positions = torch.tensor([0, 1, 2, 50, 99, 127], device=device)
    expected_q, expected_k = apply_rotary_reference(positions, q.clone(), k.clone(), cache)
    out_q, out_k = apply_rotary(positions, q, k, cache)
    assert out_q.data_ptr() == q.data_ptr()  # rotated in place
    torch.testing.assert_close(out_q, expected_q, **TOLERANCES[dtype])
    torch.testing.assert_close(out_k, expected_k, **TOLERANCES[dtype])
    assert torch.equal(qkv[:, (num_heads + num_kv_heads) * head_size :], v_before)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_silu_and_mul(dtype, device):
    x = randn(3, 2 * 1500, dtype=dtype, device=device) * 4  # two column blocks, the second partial
    torch.testing.assert_close(silu_and_mul(x), silu_and_mul_reference(x), **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize(
    "kernel,ref", [(gelu_and_mul, reference.gelu_and_mul), (gelu_tanh_and_mul, reference.gelu_tanh_and_mul)],
    ids=["exact", "tanh"],
)
def test_gelu_and_mul(kernel, ref, dtype, device):
    x = randn(3, 2 * 1100, dtype=dtype, device=device) * 4
    torch.testing.assert_close(kernel(x), ref(x), **TOLERANCES[dtype])


def test_builtin_plugin_registers_the_kernels_for_cuda_only():
    from octavo.kernels.builtin import builtin_layer_ops

    triton_impls = {impl.op: impl for impl in builtin_layer_ops() if impl.name in ("triton", "gemv")}
    assert {
        "rms_norm", "post_norm_add_rms_norm_f32_scale", "rotary_and_cache", "gelu_tanh_and_mul", "linear",
        "linear_silu_and_mul", "linear_gelu_tanh_and_mul",
    } <= set(triton_impls)
    assert all(impl.device_types == ("cuda",) for impl in triton_impls.values())
    assert triton_impls["linear"].max_tokens == 1  # OCTAVO_GEMV_MAX_TOKENS's default
    for impl in triton_impls.values():  # importable, and taking the op's arguments
        assert impl.load() is not None


def test_conformance_kit_passes_octavo_kernels_and_the_fused_rotary_path(sandbox, monkeypatch, tmp_path):
    # The kit a vendor runs, on Octavo's own kernels (registered for the cpu
    # platform, float32 only to keep the interpreter's time down).
    from octavo.platforms.cpu import CpuPlatform
    from octavo.runtime.attention.triton_paged import TritonPagedAttention
    from octavo.testing.conformance.checks import check_fused_rotary, make_context
    from octavo.testing.conformance.ops import check_ops
    from tests.kernels.triton_on_cpu import add_triton_on_cpu

    elementwise = (
        "rms_norm", "qk_rms_norm", "fused_add_rms_norm", "rms_norm_f32_scale", "fused_add_rms_norm_f32_scale",
        "post_norm_add_rms_norm_f32_scale", "rotary_embedding", "rotary_and_cache", "gelu_tanh_and_mul", "linear",
        "linear_gelu_tanh_and_mul",
    )
    add_triton_on_cpu(sandbox, ops=elementwise)
    monkeypatch.setattr(CpuPlatform, "attention_backend", lambda self, spec: TritonPagedAttention(spec))
    ctx = make_context(CpuPlatform(), tmp_path)
    ctx.dtypes = [torch.float32]
    summary = check_ops(ctx)
    for op in elementwise:
        assert f"{op}={'gemv' if op.startswith('linear') else 'triton'} [triton_on_cpu]" in summary
    assert "partly: linear: gemv [triton_on_cpu] up to 1 token, else reference" in summary
    assert check_fused_rotary(ctx).startswith("2 configurations of forward_with_rotary match rotary + torch_paged")
