"""The residual add and RMSNorm inside the decode GEMV (``kernels/norm_gemv.py``)
against the references of ``fused_add_rms_norm_linear`` and
``fused_add_rms_norm_route``, through Triton's interpreter on the CPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels import norm_gemv  # noqa: E402
from octavo.ops import reference  # noqa: E402
from octavo.testing.conformance.op_cases import OP_CASES  # noqa: E402
from tests.kernels.tolerances import assert_same_rounding  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16]
IDS = ["fp32", "bf16"]
GEMM_TOLERANCE = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def randn(*shape, seed, dtype=torch.float32, device="cpu", scale=1.0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype).to(device)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize(
    "tokens, out_features, hidden, bias",
    [(1, 44, 96, True), (1, 12, 2048 + 96, False), (3, 40, 64, True), (8, 20, 256, False)],
    ids=["one-token-partial-tile", "two-k-steps-ragged", "three-tokens", "eight-tokens"],
)
def test_norm_linear_matches_the_norm_then_the_projection(dtype, tokens, out_features, hidden, bias, device):
    x, residual = randn(tokens, hidden, seed=1, dtype=dtype, device=device), randn(tokens, hidden, seed=2, dtype=dtype, device=device)
    norm_weight = randn(hidden, seed=3, dtype=dtype, device=device)
    weight = randn(out_features, hidden, seed=4, dtype=dtype, device=device, scale=0.1)
    b = randn(out_features, seed=5, dtype=dtype, device=device) if bias else None
    x_before, residual_before = x.clone(), residual.clone()

    out, normed, summed = norm_gemv.fused_add_rms_norm_linear(x, residual, norm_weight, 1e-6, weight, b)

    expected_out, expected_normed, expected_summed = reference.fused_add_rms_norm_linear(
        x, residual, norm_weight, 1e-6, weight, b
    )
    assert_same_rounding(summed, expected_summed)  # one rounding of the same float32 sum
    torch.testing.assert_close(normed, expected_normed, **GEMM_TOLERANCE[dtype])
    torch.testing.assert_close(out, expected_out, **GEMM_TOLERANCE[dtype])
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before)  # inputs untouched


def _route_args(case_index: int, dtype, device):
    case = OP_CASES["fused_add_rms_norm_route"][case_index]
    return case, case.make(dtype, device, torch.Generator().manual_seed(case_index))


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("case_index", range(4), ids=["128-experts-top8", "3-tokens-top2", "8-tokens-top4", "top-k-all"])
def test_norm_route_picks_the_references_experts(case_index, dtype, device):
    case, args = _route_args(case_index, dtype, device)
    weights, ids, normed, summed = norm_gemv.fused_add_rms_norm_route(*args)

    expected = reference.fused_add_rms_norm_route(*args)
    assert torch.equal(ids, expected[1]), case.label  # distinct logits: the same experts, the same order
    torch.testing.assert_close(weights, expected[0], atol=1e-2 if dtype == torch.bfloat16 else 1e-5, rtol=1e-2)
    torch.testing.assert_close(normed, expected[2], **GEMM_TOLERANCE[dtype])
    assert_same_rounding(summed, expected[3])


def test_routing_leaves_its_arrival_count_at_zero_for_the_next_launch(device):
    # The last program resets the count: a second launch (or a CUDA-graph
    # replay) routes again instead of finding the count past its programs.
    _, args = _route_args(1, torch.float32, device)
    first = norm_gemv.fused_add_rms_norm_route(*args)
    assert int(norm_gemv._counter(torch.device(device)).item()) == 0
    second = norm_gemv.fused_add_rms_norm_route(*args)
    assert torch.equal(first[1], second[1]) and torch.equal(first[0], second[0])
