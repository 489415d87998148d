"""The decode MoE path (two GEMVs, the sum over k fused) against the
plain-torch reference: one and a few tokens, top-k up to every expert,
slots of experts on other ranks, widths that are not multiples of the
tiles, every activation; and that fused_moe hands it the small batches
OCTAVO_MOE_GEMV_MAX_TOKENS names."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels import fused_moe as fused_moe_module  # noqa: E402
from octavo.kernels.fused_moe import ACTIVATIONS  # noqa: E402
from octavo.kernels.fused_moe_gemv import fused_moe_gemv  # noqa: E402
from octavo.ops.reference import fused_moe as reference  # noqa: E402
from tests.kernels.test_fused_moe import TOLERANCE, dispatched_token_counts, make_inputs  # noqa: E402
from tests.kernels.tolerances import INTERPRETING  # noqa: E402


def check(out: torch.Tensor, expected: torch.Tensor) -> None:
    if out.dtype == torch.float32:
        torch.testing.assert_close(out, expected, **TOLERANCE[torch.float32])
        return
    # bf16: the reference rounds after adding each expert, the kernel once after
    # the sum over k (and the interpreter truncates where GPUs round): compared
    # by the error's norm; a wrong expert, slot or weight is an error of order 1.
    # (The grouped-GEMM path is 2% off under the interpreter on these inputs too.)
    relative_error = (out.float() - expected.float()).norm() / expected.float().norm()
    assert relative_error < (5e-2 if INTERPRETING else 1e-2), relative_error


@pytest.mark.parametrize(
    "num_tokens,num_experts,top_k,hidden,inter,activation",
    [(1, 32, 8, 40, 24, "silu"), (3, 8, 2, 64, 48, "gelu_tanh"), (2, 8, 8, 32, 16, "gelu"), (4, 16, 4, 300, 70, "silu")],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference(num_tokens, num_experts, top_k, hidden, inter, activation, dtype, device):
    x, w13, w2, weights, ids = make_inputs(num_tokens, num_experts, top_k, hidden, inter, dtype, device, seed=num_tokens)
    out = fused_moe_gemv(x, w13, w2, weights, ids, ACTIVATIONS[activation])
    check(out, reference(x, w13, w2, weights, ids, activation))


def test_experts_on_other_ranks_add_nothing(device):
    x, w13, w2, weights, ids = make_inputs(2, 8, 2, 32, 16, torch.float32, device, seed=7)
    local = torch.where(ids < 4, ids, -1)  # this rank holds experts 0-3 of 8
    assert (local < 0).any()
    out = fused_moe_gemv(x, w13[:4], w2[:4], weights, local, ACTIVATIONS["silu"])
    torch.testing.assert_close(out, reference(x, w13[:4], w2[:4], weights, local, "silu"), **TOLERANCE[torch.float32])


def test_fused_moe_dispatches_small_batches(monkeypatch, device):
    calls = dispatched_token_counts(monkeypatch, device, "fused_moe_gemv", "OCTAVO_MOE_GEMV_MAX_TOKENS",
                                    fused_moe_module.moe_gemv_max_tokens)
    assert calls == [1, 2]  # 3 tokens take the grouped GEMMs


def test_off_by_default():
    fused_moe_module.moe_gemv_max_tokens.cache_clear()
    assert fused_moe_module.moe_gemv_max_tokens() == 0


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRETING, reason="real shapes need a GPU")
@pytest.mark.parametrize(
    "num_experts,top_k,hidden,inter", [(8, 2, 4096, 14336), (128, 8, 2048, 768)], ids=["mixtral-8x7b", "qwen3-30b-a3b"]
)
@pytest.mark.parametrize("num_tokens", [1, 4])
def test_real_shapes_on_gpu_and_captured(num_experts, top_k, hidden, inter, num_tokens):
    x, w13, w2, weights, ids = make_inputs(num_tokens, num_experts, top_k, hidden, inter, torch.bfloat16, torch.device("cuda"))
    expected = reference(x.float(), w13.float(), w2.float(), weights, ids, "silu")
    out = fused_moe_gemv(x, w13, w2, weights, ids, ACTIVATIONS["silu"])
    assert (out.float() - expected).norm() / expected.norm() < 1e-2
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fused_moe_gemv(x, w13, w2, weights, ids, ACTIVATIONS["silu"])
    graph.replay()
    torch.testing.assert_close(captured, out, rtol=0, atol=0)


def test_tiles_of_each_gemv(monkeypatch):
    """Three numbers set both GEMVs' tiles, six set each (gate-up, then down);
    any other count is refused naming the variable."""
    from octavo.kernels import fused_moe_gemv as module

    for value, expected in (("16,128,2", (16, 128, 2, 16, 128, 2)), ("8,256,4,2,128,1", (8, 256, 4, 2, 128, 1))):
        monkeypatch.setenv("OCTAVO_MOE_GEMV_TILES", value)
        module.moe_gemv_tiles.cache_clear()
        assert module.moe_gemv_tiles() == expected
    monkeypatch.setenv("OCTAVO_MOE_GEMV_TILES", "8,256,4,2")
    module.moe_gemv_tiles.cache_clear()
    with pytest.raises(ValueError, match="OCTAVO_MOE_GEMV_TILES"):
        module.moe_gemv_tiles()
    monkeypatch.delenv("OCTAVO_MOE_GEMV_TILES")
    module.moe_gemv_tiles.cache_clear()


def test_separate_down_tiles_match_the_reference(device):
    x, w13, w2, weights, ids = make_inputs(2, 8, 2, 64, 48, torch.float32, device, seed=5)
    expected = reference(x, w13, w2, weights, ids, "silu")
    for tiles in ((8, 64, 2), (8, 64, 2, 2, 32, 1), (4, 32, 1, 16, 64, 2)):
        check(fused_moe_gemv(x, w13, w2, weights, ids, ACTIVATIONS["silu"], tiles), expected)
