"""The ``fused_moe_routed`` op's CUDA implementation (``moe_routed.py``): at
one token the experts' kernels pick the experts themselves from the
router's logits. Their picks must be the top-k kernel's (same slots, same
weights): under the interpreter, where a sum's order does not depend on
the warps, the gate-up rows and the down sums are compared with
``torch.equal`` against the decode form fed by ``topk_softmax``; on a GPU
the gate-up rows (the picks) exactly, the sums within float32 order. The
result against the op's reference; more tokens and the off switch take
the top-k launch."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.errors import InvalidArgumentError  # noqa: E402
from octavo.kernels import moe_routed  # noqa: E402
from octavo.kernels.fused_moe import ROWS_PER_SLOT, ROWS_ROUTED, fused_moe, gate_up  # noqa: E402
from octavo.kernels.moe_decode import down_routed, down_topk_sum  # noqa: E402
from octavo.kernels.moe_routed import fused_moe_routed  # noqa: E402
from octavo.kernels.moe_topk import topk_softmax  # noqa: E402
from octavo.ops.reference import fused_moe_routed as routed_reference  # noqa: E402
from tests.kernels.test_fused_moe import DECODE  # noqa: E402


def make_layer(num_experts, hidden, inter, dtype, device, seed, num_tokens=1, ties=False):
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=generator) * scale).to(dtype).to(device)

    x = randn(num_tokens, hidden)
    w13, w2 = randn(num_experts, 2 * inter, hidden, scale=0.1), randn(num_experts, hidden, inter, scale=0.1)
    if ties:  # many equal logits: the pick's tie-break (the lowest index) decides
        logits = torch.randn(num_tokens, num_experts, generator=generator).round(decimals=0)
    else:  # distinct, exact in bfloat16 (torch.topk, the reference's, orders ties its own way)
        ranks = torch.stack([torch.randperm(num_experts, generator=generator) for _ in range(num_tokens)])
        logits = (ranks.float() - num_experts / 2) / 16
    return x, w13, w2, logits.to(dtype).to(device)


# Qwen3-MoE's 128 experts top-8; Qwen2-MoE's 60 (not a power of two) top-4;
# top-1; top-k = every expert; ties between logits.
CASES = [(128, 8, True, False), (60, 4, False, False), (16, 1, True, False), (8, 8, False, False), (32, 6, True, True)]


@pytest.mark.parametrize("num_experts,top_k,renormalize,ties", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernels_pick_the_experts_of_the_topk_kernel(num_experts, top_k, renormalize, ties, dtype, device):
    x, w13, w2, logits = make_layer(num_experts, 40, 24, dtype, device, seed=top_k, ties=ties)
    weights, ids = topk_softmax(logits, top_k, renormalize)
    flat_ids = ids.reshape(-1).contiguous()
    expected_act = gate_up(x, w13, flat_ids, flat_ids, top_k, top_k, 0, DECODE, ROWS_PER_SLOT)
    act = gate_up(x, w13, logits, logits, top_k, top_k, 0, DECODE, ROWS_ROUTED)
    assert torch.equal(act, expected_act)
    expected = down_topk_sum(act, w2, weights, ids, tiles=(4, 4))
    assert torch.equal(down_routed(act, w2, logits, top_k, renormalize, tiles=(4, 4)), expected)


@pytest.mark.parametrize("num_experts,top_k,renormalize,ties", CASES[:3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_routed_op_matches_its_reference(num_experts, top_k, renormalize, ties, dtype, device, routed):
    x, w13, w2, logits = make_layer(num_experts, 48, 32, dtype, device, seed=num_experts)
    out = fused_moe_routed(x, w13, w2, logits, top_k, renormalize, "silu")
    expected = routed_reference(x, w13, w2, logits, top_k, renormalize, "silu")
    tolerance = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out, expected, **tolerance)


def _launches(monkeypatch) -> list[str]:
    calls = []
    for name in ("topk_softmax", "fused_moe", "gate_up", "down_routed"):
        original = getattr(moe_routed, name)
        monkeypatch.setattr(moe_routed, name, lambda *a, _o=original, _n=name, **k: calls.append(_n) or _o(*a, **k))
    return calls


ROUTED = {"OCTAVO_MOE_ROUTED": "1"}


@pytest.fixture
def routed(monkeypatch):
    """Routing in the experts' kernels turned on (off by default: slower on the H200, round 35)."""
    monkeypatch.setenv("OCTAVO_MOE_ROUTED", "1")
    moe_routed.routes_in_kernel.cache_clear()
    yield
    moe_routed.routes_in_kernel.cache_clear()


@pytest.mark.parametrize("num_tokens,env,expected", [
    (1, ROUTED, ["gate_up", "down_routed"]),
    (3, ROUTED, ["topk_softmax", "fused_moe"]),
    (1, {}, ["topk_softmax", "fused_moe"]),  # the default
    (1, {"OCTAVO_MOE_ROUTED": "0"}, ["topk_softmax", "fused_moe"]),
    (1, {**ROUTED, "OCTAVO_MOE_DECODE_MAX_TOKENS": "0"}, ["topk_softmax", "fused_moe"]),
])
def test_one_token_routes_in_the_kernels_else_the_topk_launch(num_tokens, env, expected, monkeypatch, device):
    from octavo.kernels import moe_decode

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    moe_decode.moe_decode_max_tokens.cache_clear()
    moe_routed.routes_in_kernel.cache_clear()
    try:
        calls = _launches(monkeypatch)
        x, w13, w2, logits = make_layer(16, 32, 16, torch.float32, device, seed=3, num_tokens=num_tokens)
        out = moe_routed.fused_moe_routed(x, w13, w2, logits, 4, True, "silu")
        assert calls == expected
        torch.testing.assert_close(out, routed_reference(x, w13, w2, logits, 4, True, "silu"), atol=1e-5, rtol=1e-5)
    finally:
        moe_decode.moe_decode_max_tokens.cache_clear()
        moe_routed.routes_in_kernel.cache_clear()


def test_bad_routing_arguments_are_refused(monkeypatch, device, routed):
    from types import SimpleNamespace

    from octavo.platforms.cuda import CudaPlatform

    x, w13, w2, logits = make_layer(8, 32, 16, torch.float32, device, seed=4)
    with pytest.raises(ValueError, match="top-9"):
        fused_moe_routed(x, w13, w2, logits, 9, True, "silu")
    with pytest.raises(ValueError, match="logits"):
        fused_moe_routed(x, w13, w2, logits[:, :4], 2, True, "silu")
    monkeypatch.setenv("OCTAVO_MOE_ROUTED", "yes")
    moe_routed.routes_in_kernel.cache_clear()
    try:
        with pytest.raises(InvalidArgumentError, match="OCTAVO_MOE_ROUTED"):  # at startup, not mid-run
            CudaPlatform().check_config(SimpleNamespace(dtype="bfloat16"))
    finally:
        moe_routed.routes_in_kernel.cache_clear()



@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="real shapes and CUDA graphs need a GPU")
@pytest.mark.parametrize("num_experts,top_k,hidden,inter", [(8, 2, 4096, 14336), (128, 8, 2048, 768)],
                         ids=["mixtral-8x7b", "qwen3-30b-a3b"])
def test_real_shapes_routed_in_a_cuda_graph(num_experts, top_k, hidden, inter, routed):
    """At real shapes (PDL on a Hopper GPU), captured and replayed with new
    logits: the top-k kernel's picks (the gate-up rows exactly) and the
    output of ``fused_moe`` fed by it (the weights may differ in the order
    of a float32 sum, and a slot's rounding with them)."""
    cuda = torch.device("cuda")
    x, w13, w2, logits = make_layer(num_experts, hidden, inter, torch.bfloat16, cuda, seed=11)
    ids = topk_softmax(logits, top_k, True)[1].reshape(-1).contiguous()
    expected_act = gate_up(x, w13, ids, ids, top_k, top_k, 0, DECODE, ROWS_PER_SLOT)
    assert torch.equal(gate_up(x, w13, logits, logits, top_k, top_k, 0, DECODE, ROWS_ROUTED), expected_act)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe_routed(x, w13, w2, logits, top_k, True, "silu")
    for seed in (12, 13):
        logits.copy_(make_layer(num_experts, hidden, inter, torch.bfloat16, cuda, seed=seed)[3])
        graph.replay()
        expected = fused_moe(x, w13, w2, *topk_softmax(logits, top_k, True), "silu")
        torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)  # the ops' bf16 GEMM bound
