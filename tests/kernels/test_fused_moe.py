"""The fused MoE kernel (two grouped GEMMs, SiLU-and-mul and routing weights
fused) against the plain-torch reference that loops over experts: uneven
expert loads, experts with no tokens, top-k equal to the number of experts,
slots of experts held by another rank (-1), decode and prefill tile shapes,
sizes that are not multiples of the tiles; and the expert alignment it
starts from. On the CPU through Triton's interpreter; on a GPU at real
shapes too (Mixtral-8x7B, Qwen3-30B-A3B layers)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels import fused_moe as fused_moe_module  # noqa: E402
from octavo.kernels.fused_moe import MoeTiles, fused_moe, moe_tiles  # noqa: E402
from octavo.kernels import moe_align  # noqa: E402
from octavo.kernels import moe_tiles as moe_tiles_module  # noqa: E402
from octavo.kernels.moe_align import align_to_experts, align_to_experts_torch  # noqa: E402
from octavo.kernels.moe_topk import topk_softmax  # noqa: E402
from octavo.ops.reference import fused_moe as fused_moe_reference  # noqa: E402
from octavo.ops.reference import moe_topk_softmax as select_experts  # noqa: E402
from tests.kernels.tolerances import INTERPRETING  # noqa: E402
from tests.plugins.fake_plugins import sandbox  # noqa: E402, F401

DECODE = MoeTiles(16, 32, 32, 4, 2)
PREFILL = MoeTiles(32, 64, 64, 4, 2)
TOLERANCE = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def make_inputs(num_tokens, num_experts, top_k, hidden, inter, dtype, device, skew=0.0, seed=0):
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=generator) * scale).to(dtype).to(device)

    x = randn(num_tokens, hidden)
    w13, w2 = randn(num_experts, 2 * inter, hidden, scale=0.1), randn(num_experts, hidden, inter, scale=0.1)
    logits = torch.randn(num_tokens, num_experts, generator=generator)
    logits[:, : num_experts // 2] += skew  # skew > 0: the first half takes most tokens
    weights, ids = select_experts(logits, top_k, renormalize=True)
    return x, w13, w2, weights.to(device), ids.to(device)


def dispatched_token_counts(monkeypatch, device, path: str, env: str, cached_limit) -> list[int]:
    """``fused_moe`` at 1, 2 and 3 tokens with ``env`` (a token limit read once,
    through ``cached_limit``) set to 2, each output checked against the
    reference; the token counts with which it called ``fused_moe_module.<path>``."""
    calls = []
    original = getattr(fused_moe_module, path)
    monkeypatch.setattr(fused_moe_module, path, lambda *a: calls.append(a[0].shape[0]) or original(*a))
    monkeypatch.setenv(env, "2")
    cached_limit.cache_clear()
    try:
        for num_tokens in (1, 2, 3):
            x, w13, w2, weights, ids = make_inputs(num_tokens, 8, 2, 32, 16, torch.float32, device)
            torch.testing.assert_close(fused_moe(x, w13, w2, weights, ids),
                                       fused_moe_reference(x, w13, w2, weights, ids, "silu"), **TOLERANCE[torch.float32])
    finally:
        cached_limit.cache_clear()
    return calls


def check(inputs, tiles, dtype, activation="silu", decode=False):
    x, w13, w2, weights, ids = inputs
    out = fused_moe(x, w13, w2, weights, ids, activation, tiles, decode)
    expected = fused_moe_reference(x, w13, w2, weights, ids, activation)
    torch.testing.assert_close(out, expected, **TOLERANCE[dtype])


@pytest.mark.parametrize(
    "tiles,decode", [(DECODE, False), (PREFILL, False), (DECODE, True)], ids=["decode-tiles", "prefill-tiles", "decode-form"]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_uneven_loads_and_idle_experts(tiles, decode, dtype, device):
    # 8 experts, top-2, tokens skewed onto experts 0-3: experts 4-7 get few
    # or no tokens; 40 hidden / 24 intermediate are not multiples of the tiles.
    inputs = make_inputs(13, 8, 2, 40, 24, dtype, device, skew=6.0)
    ids = inputs[4]
    counts = torch.bincount(ids.flatten().long().cpu(), minlength=8)
    assert counts.min() == 0 and counts.max() >= 8
    check(inputs, tiles, dtype, decode=decode)


@pytest.mark.parametrize("decode", [False, True], ids=["grouped", "decode-form"])
@pytest.mark.parametrize("activation", ["silu", "gelu", "gelu_tanh"])
def test_top_k_equals_num_experts(activation, decode, device):
    check(make_inputs(5, 8, 8, 32, 32, torch.float32, device), DECODE, torch.float32, activation, decode)


@pytest.mark.parametrize("decode", [False, True], ids=["grouped", "decode-form"])
def test_single_token_many_experts(decode, device):
    # Decode at Qwen3-MoE's routing (top-8 of many): most experts idle.
    check(make_inputs(1, 32, 8, 32, 16, torch.float32, device, seed=3), DECODE, torch.float32, decode=decode)


@pytest.mark.parametrize("tiles,decode", [(PREFILL, False), (DECODE, True)], ids=["grouped", "decode-form"])
def test_experts_on_other_ranks_add_nothing(tiles, decode, device):
    x, w13, w2, weights, ids = make_inputs(9, 8, 2, 32, 16, torch.float32, device, seed=1)
    local = torch.where(ids < 4, ids, -1)  # this rank holds experts 0-3 of 8
    out = fused_moe(x, w13[:4], w2[:4], weights, local, "silu", tiles, decode)
    expected = fused_moe_reference(x, w13[:4], w2[:4], weights, local, "silu")
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_alignment_groups_every_slot_once(device):
    ids = torch.tensor([[3, 0], [3, 1], [0, -1], [3, 3]], dtype=torch.int32, device=device)
    align = align_to_experts(ids, num_experts=4, block_m=4)
    num_slots = ids.numel()
    slots, experts = align.sorted_slots.tolist(), align.block_experts.tolist()
    assert sorted(s for s in slots if s < num_slots) == [0, 1, 2, 3, 4, 6, 7]  # slot 5 (-1) is dropped
    for block, expert in enumerate(experts):
        real = [s for s in slots[4 * block : 4 * block + 4] if s < num_slots]
        assert all(ids.flatten()[s] == expert for s in real)
        assert expert >= 0 or not real
    # Experts 0, 1, 3 each fill one padded block, expert 2 none; the rest is spare.
    assert experts[:3] == [0, 1, 3] and set(experts[3:]) == {-1}


@pytest.mark.parametrize("num_tokens,num_experts,top_k,block_m", [(1, 128, 8, 16), (37, 8, 2, 16), (100, 20, 6, 32)])
def test_alignment_kernel_matches_torch_sort(num_tokens, num_experts, top_k, block_m, device):
    generator = torch.Generator().manual_seed(num_tokens)
    ids = torch.stack([torch.randperm(num_experts, generator=generator)[:top_k] for _ in range(num_tokens)])
    ids[ids % 7 == 3] = -1  # some slots' experts live on another rank
    ids = ids.to(torch.int32).to(device)
    kernel, torch_sort = align_to_experts(ids, num_experts, block_m), align_to_experts_torch(ids, num_experts, block_m)
    assert torch.equal(kernel.sorted_slots, torch_sort.sorted_slots)
    assert torch.equal(kernel.block_experts, torch_sort.block_experts)


def test_sum_over_topk_leaves_out_unwritten_rows(device):
    # The grouped path's last launch: rows of slots whose expert is on another
    # rank are never written (here NaN) and must add nothing.
    ids = torch.tensor([[0, -1, 2], [-1, -1, 1], [3, 1, 0]], dtype=torch.int32, device=device)
    per_slot = torch.randn(9, 40, generator=torch.Generator().manual_seed(0)).to(device)
    per_slot[(ids.reshape(-1) < 0)] = float("nan")
    out = fused_moe_module.sum_over_topk(per_slot, ids)
    expected = torch.where((ids >= 0)[..., None], per_slot.view(3, 3, 40), 0.0).sum(dim=1)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)


@pytest.fixture
def chunked_align(monkeypatch):
    """Sets ``OCTAVO_MOE_CHUNKED_ALIGN`` for one test: the switch is read once
    and cached, so the cache is cleared on the way in and out."""

    def set_to(value: str) -> None:
        monkeypatch.setenv("OCTAVO_MOE_CHUNKED_ALIGN", value)
        moe_align.chunked_align_enabled.cache_clear()

    yield set_to
    moe_align.chunked_align_enabled.cache_clear()


@pytest.mark.parametrize("chunked", ["1", "0"], ids=["program-per-64-slots", "one-program"])
@pytest.mark.parametrize(
    "num_tokens,num_experts,top_k,block_m",
    [(40, 128, 8, 16), (50, 8, 2, 32), (96, 20, 6, 16), (9, 4, 4, 16), (256, 4, 4, 128)],
    ids=["qwen3-moe-like", "mixtral-like", "uneven", "one-chunk", "more-programs-than-blocks"],
)
def test_alignment_forms_match_torch_sort(num_tokens, num_experts, top_k, block_m, chunked, device, chunked_align):
    # The kernel's two forms: a program per 64 slots (each counting every slot,
    # placing its own, marking its share of the padding, tail and block
    # experts), and one program for all (OCTAVO_MOE_CHUNKED_ALIGN=0). Skewed
    # routing leaves some experts empty and gives others several blocks.
    chunked_align(chunked)
    generator = torch.Generator().manual_seed(num_experts)
    logits = torch.randn(num_tokens, num_experts, generator=generator)
    logits[:, : num_experts // 4] += 2.0
    ids = logits.topk(top_k, dim=1).indices
    ids[ids % 5 == 2] = -1  # some slots' experts live on another rank
    ids = ids.to(torch.int32).to(device)
    aligned = align_to_experts(ids, num_experts, block_m)
    torch_sort = align_to_experts_torch(ids, num_experts, block_m)
    assert torch.equal(aligned.sorted_slots, torch_sort.sorted_slots)
    assert torch.equal(aligned.block_experts, torch_sort.block_experts)


@pytest.mark.parametrize("chunked,limit", [("1", "CHUNKED_ALIGN_MAX_SLOTS"), ("0", "ALIGN_KERNEL_MAX_SLOTS")])
def test_batches_past_the_kernel_go_to_the_sort(chunked, limit, monkeypatch, chunked_align):
    chunked_align(chunked)
    calls = []
    monkeypatch.setattr(moe_align, "align_to_experts_torch", lambda *args: calls.append(args) or "sorted")
    assert align_to_experts(torch.zeros(getattr(moe_align, limit) + 1, 1, dtype=torch.int32), 4, 16) == "sorted"
    assert len(calls) == 1


@pytest.mark.parametrize("num_experts,top_k,renormalize", [(8, 2, True), (128, 8, True), (60, 4, False), (8, 8, False)])
def test_router_topk_matches_reference(num_experts, top_k, renormalize, device):
    logits = torch.randn(5, num_experts, generator=torch.Generator().manual_seed(num_experts)).to(device)
    weights, ids = topk_softmax(logits, top_k, renormalize)
    expected_weights, expected_ids = select_experts(logits, top_k, renormalize)
    assert torch.equal(ids, expected_ids)
    torch.testing.assert_close(weights, expected_weights, atol=1e-6, rtol=1e-6)


def test_tiles_follow_tokens_per_expert():
    assert moe_tiles(1, 8, 128).block_m == 16  # decode
    assert moe_tiles(8192, 2, 8).block_m == 128  # Mixtral prefill: 2048 tokens per expert
    assert moe_tiles(512, 8, 128).block_m == 32


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRETING, reason="real shapes need a GPU")
@pytest.mark.parametrize(
    "num_experts,top_k,hidden,inter", [(8, 2, 4096, 14336), (128, 8, 2048, 768)], ids=["mixtral-8x7b", "qwen3-30b-a3b"]
)
@pytest.mark.parametrize("num_tokens,decode", [(1, None), (1, False), (4, True), (64, None), (2048, None)])
def test_real_shapes_on_gpu(num_experts, top_k, hidden, inter, num_tokens, decode):
    inputs = make_inputs(num_tokens, num_experts, top_k, hidden, inter, torch.bfloat16, torch.device("cuda"))
    x, w13, w2, weights, ids = inputs
    out = fused_moe(x, w13, w2, weights, ids, decode=decode)
    expected = fused_moe_reference(x.float(), w13.float(), w2.float(), weights, ids, "silu")
    # Outputs reach ~500 at these widths and the kernel rounds the activation
    # to bf16 as the bf16 reference does (~0.4% per element): compared by the
    # error's norm. One wrong expert or slot would be an error of order 1.
    relative_error = (out.float() - expected).norm() / expected.norm()
    assert relative_error < 1e-2, relative_error


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRETING or not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("num_tokens", [1, 8, 512, 4096], ids=["decode-form", "align-kernel", "align-chunked", "align-torch-sort"])
def test_captured_in_a_cuda_graph(num_tokens):
    # The engine captures decode and prefill steps in CUDA graphs: the decode
    # form and every alignment path (the one-program kernel, its chunked form
    # and the sort past their slot limits) must capture, and the replay must match an eager call
    # on new inputs.
    x, w13, w2, weights, ids = make_inputs(num_tokens, 128, 8, 256, 128, torch.bfloat16, torch.device("cuda"))
    fused_moe(x, w13, w2, weights, ids)  # compile the kernels outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe(x, w13, w2, weights, ids)
    fresh = make_inputs(num_tokens, 128, 8, 256, 128, torch.bfloat16, torch.device("cuda"), seed=5)
    for buffer, value in zip((x, weights, ids), (fresh[0], fresh[3], fresh[4])):
        buffer.copy_(value)
    graph.replay()
    torch.testing.assert_close(out, fused_moe(x, w13, w2, weights, ids), atol=1e-2, rtol=1e-2)


@pytest.mark.skipif(not INTERPRETING, reason="runs the Triton kernels on the CPU through the interpreter")
def test_registered_as_layer_ops_and_conformant(sandbox, tmp_path):
    """The built-in plugin offers the three MoE ops for CUDA; run through the
    conformance kit's op check (the vendor's check) on the CPU, they match
    their references on its grid (an idle expert, several activations)."""
    from octavo.kernels.builtin import builtin_layer_ops
    from octavo.platforms.cpu import CpuPlatform
    from octavo.testing.conformance.checks import make_context
    from octavo.testing.conformance.ops import check_ops
    from tests.kernels.triton_on_cpu import add_triton_on_cpu

    ops = ("moe_topk_softmax", "fused_moe", "fused_moe_routed")
    impls = {impl.op: impl for impl in builtin_layer_ops() if impl.op in ops}
    assert set(impls) == set(ops) and all(impl.device_types == ("cuda",) for impl in impls.values())
    add_triton_on_cpu(sandbox, ops=ops)
    ctx = make_context(CpuPlatform(), tmp_path)
    ctx.dtypes = [torch.float32]
    summary = check_ops(ctx)
    for op in ops:
        assert f"{op}=triton [triton_on_cpu]" in summary


def load_benchmark(monkeypatch):
    import importlib.util
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "moe_gpu.py"
    spec = importlib.util.spec_from_file_location("moe_gpu_bench", script)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU smoke run; on a GPU run the script itself")
def test_gpu_benchmark_runs_on_tiny_shapes(tmp_path, monkeypatch, capsys):
    """benchmarks/moe_gpu.py (the GPU round's moe_bench / moe_sweep steps)
    on the CPU: the kernel, the reference, the floor, a two-shape sweep and
    the two-GEMV decode path."""
    import json

    module = load_benchmark(monkeypatch)
    monkeypatch.setenv("OUT", str(tmp_path))
    assert module.main(["--smoke", "--tokens", "3", "--sweep"]) == 0
    out = capsys.readouterr().out
    assert "tiny      3" in out and out.count(" sweep ") == 2
    records = [json.loads(line) for line in (tmp_path / "moe_gpu.jsonl").read_text().splitlines()]
    case = records[0]
    assert case["routed_experts"] <= 8 and case["max_error"] < 1e-5 and case["floor_us"] > 0
    gemv = [r for r in records[1:] if "gemv_us" in r]  # the two-GEMV decode path, two tile shapes
    assert len(gemv) == 2 and all(r["tokens"] == 3 and r["gemv_us"] > 0 for r in gemv)
    assert " gemv " in out
    assert [r["tokens"] for r in records[1:] if "sweep_tiles" in r] == [3, 3]
    # The alignment alone, each form checked against the sort.
    aligns = {r["align"]: r for r in records if "align" in r}
    assert set(aligns) == {"chunked", "torch sort", "one program"} and all(r["same"] for r in aligns.values())


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU smoke run; on a GPU run the script itself")
def test_gpu_benchmark_times_the_decode_form(tmp_path, monkeypatch, capsys):
    """At 1 token: the decode form beside the grouped path, two down tiles,
    and the MoE block before (cuBLAS router, grouped), after (the decode
    form) and routed in the experts' kernels."""
    import json

    module = load_benchmark(monkeypatch)
    monkeypatch.setenv("OUT", str(tmp_path))
    assert module.main(["--smoke", "--tokens", "1", "--decode-tiles", "--skip-gemv"]) == 0
    records = [json.loads(line) for line in (tmp_path / "moe_gpu.jsonl").read_text().splitlines()]
    forms = {r["form"]: r for r in records if "form" in r}
    assert set(forms) == {"decode", "grouped"} and all(r["max_error"] < 1e-5 for r in forms.values())
    assert len([r for r in records if "down_tiles" in r]) == 2
    assert [r["block"] for r in records if "block" in r] == ["before", "after", "routed"]
    assert not any("gemv_us" in r for r in records)
    assert "block max |after - before|" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU smoke run; on a GPU run the script itself")
def test_gpu_benchmark_sweeps_the_grouped_down_tiles(tmp_path, monkeypatch, capsys):
    """``--down-sweep``: the grouped path with the down kernel's own tiles
    (the gate-up's at their default), each output equal to the default's."""
    import json

    module = load_benchmark(monkeypatch)
    monkeypatch.setenv("OUT", str(tmp_path))
    assert module.main(["--smoke", "--tokens", "12", "--down-sweep", "--skip-gemv"]) == 0
    records = [json.loads(line) for line in (tmp_path / "moe_gpu.jsonl").read_text().splitlines()]
    swept = [r for r in records if "down_sweep_tiles" in r]
    assert len(swept) == 2 and all(r["tokens"] == 12 and r["us"] > 0 for r in swept)
    assert "OCTAVO_MOE_GROUPED_DOWN_TILES=" in capsys.readouterr().out


def test_grouped_down_tiles_change_nothing_but_speed(device):
    # The down kernel with its own column and K tiles (block_m stays the
    # alignment's) computes what the shared tiles do.
    inputs = make_inputs(12, 8, 2, 64, 48, torch.float32, device)
    shared = fused_moe(*inputs, "silu", PREFILL, False)
    own = fused_moe(*inputs, "silu", PREFILL, False, moe_tiles_module.DownTiles(16, 32, 4, 2))
    torch.testing.assert_close(own, shared, atol=1e-5, rtol=1e-5)


def test_grouped_down_tiles_from_the_environment(monkeypatch):
    monkeypatch.setenv("OCTAVO_MOE_GROUPED_DOWN_TILES", "128,64,8,3")
    moe_tiles_module._down_tiles_from_env.cache_clear()
    try:
        # block_m stays the alignment's (PREFILL's 32); the rest is the override's.
        assert moe_tiles_module.grouped_down_tiles(PREFILL) == MoeTiles(32, 128, 64, 8, 3)
        monkeypatch.delenv("OCTAVO_MOE_GROUPED_DOWN_TILES")
        moe_tiles_module._down_tiles_from_env.cache_clear()
        assert moe_tiles_module.grouped_down_tiles(PREFILL) == PREFILL  # the gate-up's
    finally:
        moe_tiles_module._down_tiles_from_env.cache_clear()


def test_wide_down_tiles_for_narrow_experts_at_prefill_on_hopper_memory(monkeypatch):
    # Round 41 (H100): (256, 64; 8 warps, 4 stages) under the 128-row prefill tile, experts <= 1,024 wide,
    # where shared memory holds its four stages (192 KiB in bf16); elsewhere the gate-up's tiles.
    mt = moe_tiles_module
    prefill = mt.moe_tiles(8192, 8, 128)
    assert prefill.block_m == 128
    assert mt.default_down_tiles(prefill, 768, 227 * 1024) == mt.WIDE_DOWN
    assert mt.default_down_tiles(prefill, 768, 164 * 1024) is None  # an A100's: four stages do not fit
    # float32 (a test model's): 384 KiB, refused at launch by an H100 (232,448 bytes): the gate-up's fitted tiles
    assert mt.default_down_tiles(prefill, 768, 232448, element_size=4) is None
    assert mt.default_down_tiles(prefill, 14336, 227 * 1024) is None  # Mixtral's wide experts: not measured
    assert mt.default_down_tiles(mt.moe_tiles(512, 8, 128), 768, 227 * 1024) is None  # 32 an expert
    assert mt.grouped_down_tiles(prefill, None, mt.WIDE_DOWN) == MoeTiles(128, 256, 64, 8, 4)
    monkeypatch.setenv("OCTAVO_MOE_GROUPED_DOWN_TILES", "128,64,8,3")  # a tuning run's override comes first
    mt._down_tiles_from_env.cache_clear()
    try:
        assert mt.grouped_down_tiles(prefill, None, mt.WIDE_DOWN) == MoeTiles(128, 128, 64, 8, 3)
    finally:
        mt._down_tiles_from_env.cache_clear()


def test_max_slots_moves_the_kernels_limit(device, monkeypatch):
    # Tuning runs time the chunked kernel past the size where the engine takes
    # the sort (moe_gpu.py's align rows): same result as the sort.
    monkeypatch.setattr(moe_align, "CHUNKED_ALIGN_MAX_SLOTS", 64)
    calls = []
    real_sort = moe_align.align_to_experts_torch
    monkeypatch.setattr(moe_align, "align_to_experts_torch", lambda *args: calls.append(args) or real_sort(*args))
    ids = torch.randint(0, 16, (40, 4), generator=torch.Generator().manual_seed(3)).to(torch.int32).to(device)
    forced = align_to_experts(ids, 16, 16, True, max_slots=ids.numel())
    assert not calls
    sorted_ = align_to_experts(ids, 16, 16, True)
    assert len(calls) == 1 and torch.equal(forced.sorted_slots, sorted_.sorted_slots)
    assert torch.equal(forced.block_experts, sorted_.block_experts)


def test_a_malformed_alignment_switch_fails_at_startup(chunked_align):
    from types import SimpleNamespace

    from octavo.errors import InvalidArgumentError
    from octavo.platforms.cuda import CudaPlatform

    chunked_align("yes")
    with pytest.raises(InvalidArgumentError, match="OCTAVO_MOE_CHUNKED_ALIGN"):  # not mid-run
        CudaPlatform().check_config(SimpleNamespace(dtype="bfloat16"))


def test_tiles_fit_shared_memory():
    """bf16's tiles are kept; float32 on the large tiles (288 KiB, over an
    H100's 227) loses a stage, then half its K, until it fits."""
    from octavo.kernels.moe_tiles import MoeTiles, fit_shared_memory

    large = MoeTiles(128, 128, 64, 8, 3)
    assert fit_shared_memory(large, 2) == large
    fitted = fit_shared_memory(large, 4)
    assert fitted == MoeTiles(128, 128, 32, 8, 2)
    assert (fitted.block_m + 2 * fitted.block_n) * fitted.block_k * 4 * fitted.num_stages <= 160 * 1024
