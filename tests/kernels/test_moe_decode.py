"""The MoE decode form (``moe_decode.py``): the down kernel that sums each
token's top-k slots itself, against the plain-torch reference and the
grouped path, deterministic, never reading the rows of slots held by
another rank; ``fused_moe`` choosing it by token count; and the number of
kernel launches of one MoE layer at one token with the Triton ops (counted
through the interpreter)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from octavo.kernels import moe_decode  # noqa: E402
from octavo.kernels.fused_moe import fused_moe  # noqa: E402
from octavo.kernels.moe_align import align_to_experts_torch, block_of_alignment  # noqa: E402
from octavo.kernels.moe_decode import down_topk_sum  # noqa: E402
from octavo.ops.reference import fused_moe as fused_moe_reference  # noqa: E402
from tests.kernels.test_fused_moe import DECODE, PREFILL, dispatched_token_counts, make_inputs  # noqa: E402
from tests.kernels.tolerances import INTERPRETING  # noqa: E402
from tests.plugins.fake_plugins import sandbox  # noqa: E402, F401


def down_reference(act, w2, weights, ids):
    """Per slot: its expert's product rounded, times its weight rounded, rounded; summed in float32."""
    num_tokens, top_k = ids.shape
    out = torch.zeros(num_tokens, w2.shape[1], dtype=torch.float32, device=act.device)
    for token in range(num_tokens):
        for j in range(top_k):
            expert, slot = int(ids[token, j]), token * top_k + j
            if expert < 0:
                continue
            product = F.linear(act[slot].float(), w2[expert].float()).to(act.dtype)
            out[token] += (product * weights[token, j].to(act.dtype)).float()
    return out.to(act.dtype)


@pytest.mark.parametrize(
    "num_tokens,num_experts,top_k,hidden,inter",
    # top-1; top-6 (padded to 8 in the kernel); top-k = every expert; widths off the tiles.
    [(1, 16, 1, 40, 24), (2, 32, 6, 37, 70), (3, 8, 8, 64, 48), (1, 128, 8, 33, 300)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tiles", [(4, 4), (4, 4, 3)], ids=["default", "pipelined"])  # stages: Triton's pipelining
def test_down_sum_matches_reference(num_tokens, num_experts, top_k, hidden, inter, dtype, tiles, device):
    x, w13, w2, weights, ids = make_inputs(num_tokens, num_experts, top_k, hidden, inter, dtype, device, seed=top_k)
    generator = torch.Generator().manual_seed(1)
    act = torch.randn(num_tokens * top_k, inter, generator=generator).to(dtype).to(device)
    out = down_topk_sum(act, w2, weights, ids, tiles=tiles)
    # Same rounding steps: float32 to summation order; bf16 within one rounding of the sum.
    tolerance = dict(atol=1e-6, rtol=1e-6) if dtype == torch.float32 else dict(atol=1e-2, rtol=8e-3)
    torch.testing.assert_close(out, down_reference(act, w2, weights, ids), **tolerance)


def test_down_sum_is_deterministic_and_skips_other_ranks(device):
    x, w13, w2, weights, ids = make_inputs(3, 8, 4, 48, 40, torch.float32, device, seed=2)
    local = torch.where(ids < 4, ids, -1)
    assert (local < 0).any() and (local >= 0).any()
    act = torch.randn(12, 40, generator=torch.Generator().manual_seed(3)).to(device)
    act[(local.flatten() < 0).nonzero().flatten()] = float("nan")  # never written by gate-up: must not be read
    first = down_topk_sum(act, w2[:4], weights, local, tiles=(2, 4))
    assert torch.isfinite(first).all()
    torch.testing.assert_close(first, down_reference(act, w2[:4], weights, local), atol=1e-6, rtol=1e-6)
    assert torch.equal(first, down_topk_sum(act, w2[:4], weights, local, tiles=(2, 4)))


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_decode_form_matches_grouped_path(activation, device):
    # Same rounding steps as the grouped GEMMs, float32 accumulation in another order.
    x, w13, w2, weights, ids = make_inputs(4, 16, 4, 48, 40, torch.float32, device, skew=3.0, seed=4)
    decode = fused_moe(x, w13, w2, weights, ids, activation, DECODE, decode=True)
    grouped = fused_moe(x, w13, w2, weights, ids, activation, PREFILL, decode=False)
    torch.testing.assert_close(decode, grouped, atol=1e-6, rtol=1e-6)
    expected = fused_moe_reference(x, w13, w2, weights, ids, activation)
    torch.testing.assert_close(decode, expected, atol=1e-5, rtol=1e-5)


def test_fused_moe_takes_the_decode_form_by_token_count(monkeypatch, device):
    calls = dispatched_token_counts(monkeypatch, device, "_decode", "OCTAVO_MOE_DECODE_MAX_TOKENS",
                                    moe_decode.moe_decode_max_tokens)
    assert calls == [1, 2]


def test_decode_max_tokens_refuses_bad_values(monkeypatch):
    monkeypatch.setenv("OCTAVO_MOE_DECODE_MAX_TOKENS", "many")
    moe_decode.moe_decode_max_tokens.cache_clear()
    try:
        with pytest.raises(ValueError, match="OCTAVO_MOE_DECODE_MAX_TOKENS"):
            moe_decode.moe_decode_max_tokens()
    finally:
        moe_decode.moe_decode_max_tokens.cache_clear()


def _moe_block(ops, num_experts=16, top_k=4, hidden=32, inter=24):
    from types import SimpleNamespace

    from octavo.models.layers.moe import SparseMoeBlock
    from octavo.models.moe_config import MoEConfig

    moe = MoEConfig(num_experts=num_experts, top_k=top_k, intermediate_size=inter, renormalize=True,
                    sparse_layers=(True,))
    config = SimpleNamespace(moe=moe, hidden_size=hidden, model_type="qwen3_moe", hidden_act="silu")
    ctx = SimpleNamespace(config=config, dtype=torch.float32, expert_parallel=False, ops=ops)
    block = SparseMoeBlock(ctx, "model.layers.0.mlp")
    generator = torch.Generator().manual_seed(0)
    for param in block.parameters():
        param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    return block


@pytest.mark.skipif(not INTERPRETING, reason="counts launches through Triton's interpreter")
@pytest.mark.parametrize("routed", [True, False], ids=["routed-in-kernel", "topk-launch"])
def test_one_token_moe_layer_is_three_launches(routed, monkeypatch):
    from octavo.kernels import moe_routed

    monkeypatch.setenv("OCTAVO_MOE_ROUTED", "1")  # off by default (round 35: slower on the H200)
    moe_routed.routes_in_kernel.cache_clear()
    monkeypatch.setattr(moe_routed, "routes_in_kernel", lambda: True)
    """Router GEMV, gate-up, down with the sum over k, the experts picked in
    both (``fused_moe_routed``): three kernels and no torch op that
    computes (each would be a launch on the GPU; the grouped path took
    seven: cuBLAS router, top-k, alignment, gate-up, zero fill, down, sum).
    Without the routed op (a platform registering only ``fused_moe``), the
    top-k softmax is a fourth."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from triton.runtime.interpreter import InterpretedFunction

    from octavo.kernels.gemv import linear_gemv
    from octavo.kernels.moe_routed import fused_moe_routed
    from octavo.kernels.moe_topk import topk_softmax
    from octavo.ops import reference_layer_ops
    from octavo.ops.specs import OP_SPECS

    # What the cuda platform resolves at one token (the GEMV's max_tokens aside).
    ops = dataclasses.replace(reference_layer_ops(), linear=linear_gemv, moe_topk_softmax=topk_softmax,
                              fused_moe=fused_moe)
    composed = OP_SPECS["fused_moe_routed"].compose(dataclasses.asdict(ops))
    ops = dataclasses.replace(ops, fused_moe_routed=fused_moe_routed if routed else composed)
    reference_block = _moe_block(reference_layer_ops())
    block = _moe_block(ops)
    launches, torch_ops, in_kernel = [], [], []
    original_run = InterpretedFunction.run

    def run(self, *args, **kwargs):
        launches.append(self.__name__)
        in_kernel.append(True)  # the interpreter's own tensor copies are not GPU work
        try:
            return original_run(self, *args, **kwargs)
        finally:
            in_kernel.pop()

    monkeypatch.setattr(InterpretedFunction, "run", run)

    class RecordOps(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not in_kernel:
                torch_ops.append(str(func.overloadpacket.__name__))
            return func(*args, **(kwargs or {}))

    hidden = torch.randn(1, 32, generator=torch.Generator().manual_seed(5))
    expected = reference_block(hidden)
    with RecordOps():
        out = block(hidden)
    topk = [] if routed else ["_topk_softmax_kernel"]
    assert launches == ["_gemv_kernel", *topk, "_gate_up_kernel", "_down_topk_sum_kernel"]
    # Between the kernels: allocations and views only.
    assert set(torch_ops) <= {"empty", "view", "_unsafe_view", "detach", "alias"}, torch_ops
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not INTERPRETING, reason="the Triton path on the CPU platform, through the interpreter")
def test_qwen3_moe_greedy_tokens_match_the_reference_ops(family_dir, make_llm, sandbox):
    """A Qwen3-MoE checkpoint (float32) on Octavo's Triton ops registered
    for the CPU, decode steps of one token: the router's GEMV, top-k and
    the decode form; greedy tokens as with the references."""
    from octavo import SamplingParams
    from octavo.plugins.manager import reset_plugin_manager
    from tests.kernels.triton_on_cpu import add_triton_on_cpu

    path = family_dir("qwen3_moe")
    prompts = [{"prompt_token_ids": [5, 9, 23, 7, 41, 3]}]
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in make_llm(path).generate(prompts, params)]

    add_triton_on_cpu(sandbox, ops=("linear", "moe_topk_softmax", "fused_moe", "fused_moe_routed"))
    reset_plugin_manager()
    llm = make_llm(path)
    model = llm.engine.executor.worker.runner.model
    block = next(m for m in model.modules() if type(m).__name__ == "SparseMoeBlock")
    assert block.experts.experts_op.__module__ == "octavo.kernels.fused_moe"
    assert block.router_op.__module__ == "octavo.kernels.moe_topk"
    assert block.routed_experts_op.__module__ == "octavo.kernels.moe_routed"  # decode: routed in the kernels
    assert block.gate.linear_op.__name__ == "within_max_tokens"  # the GEMV at one token, else F.linear
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == expected


@triton.jit
def _blocks_kernel(
    ids_ptr, experts_ptr, slots_ptr, num_slots, BLOCK_M: tl.constexpr, E_PAD: tl.constexpr, SLOTS_PAD: tl.constexpr,
):
    pid = tl.program_id(0)
    expert, slots = block_of_alignment(ids_ptr, pid, num_slots, BLOCK_M, E_PAD, SLOTS_PAD)
    tl.store(experts_ptr + pid, expert)
    tl.store(slots_ptr + pid * BLOCK_M + tl.arange(0, BLOCK_M), slots)


@pytest.mark.parametrize("num_tokens,num_experts,top_k,block_m", [(2, 128, 8, 16), (13, 8, 2, 16), (20, 60, 6, 16)])
def test_alignment_computed_in_the_kernel_matches_the_aligned_arrays(num_tokens, num_experts, top_k, block_m, device):
    generator = torch.Generator().manual_seed(num_tokens)
    rows = [torch.randperm(num_experts - 1, generator=generator)[: top_k - 1] for _ in range(num_tokens)]
    # Every token also takes expert 5: its run is longer than a block past block_m tokens.
    ids = torch.stack([torch.cat([torch.tensor([5]), row + (row >= 5)]) for row in rows])
    ids[ids % 7 == 3] = -1  # some slots' experts live on another rank
    ids = ids.to(torch.int32).to(device)
    expected = align_to_experts_torch(ids, num_experts, block_m)
    num_blocks = expected.block_experts.numel()
    experts = torch.empty(num_blocks, dtype=torch.int32, device=device)
    slots = torch.empty(num_blocks * block_m, dtype=torch.int32, device=device)
    _blocks_kernel[(num_blocks,)](ids.flatten(), experts, slots, ids.numel(), BLOCK_M=block_m,
                                 E_PAD=max(16, triton.next_power_of_2(num_experts)),
                                 SLOTS_PAD=max(16, triton.next_power_of_2(ids.numel())))
    assert torch.equal(experts, expected.block_experts)
    assert torch.equal(slots, expected.sorted_slots)


@pytest.mark.parametrize("num_tokens", [3, 20], ids=["aligned-in-kernel", "aligned-arrays"])
def test_decode_form_at_a_few_tokens(num_tokens, device):
    # 3 x 8 slots: each gate-up program aligns its own block; 20 x 8 = 160 slots: past the in-kernel limit.
    x, w13, w2, weights, ids = make_inputs(num_tokens, 16, 8, 32, 24, torch.float32, device, skew=4.0, seed=9)
    out = fused_moe(x, w13, w2, weights, ids, "silu", DECODE, decode=True)
    torch.testing.assert_close(out, fused_moe_reference(x, w13, w2, weights, ids, "silu"), atol=1e-5, rtol=1e-5)
