"""The fused MoE kernel at real shapes, against its floor: ``python benchmarks/moe_gpu.py``.

One MoE layer (the router has run) of Qwen3-30B-A3B (128 experts, top-8,
hidden 2048, expert width 768) and Mixtral-8x7B (8 experts, top-2, hidden
4096, width 14336), shapes read from ``benchmarks/configs``, bfloat16, at
1 / 8 / 64 / 512 / 4096 tokens with random routing. Per case: the Triton
kernel with the tiles ``moe_tiles`` picks, the plain-torch reference (a loop
over experts, what a platform without the kernel runs), and the floor of
the same run: the larger of the expert weights the step reads (only the
experts some token is routed to) over the measured copy bandwidth, and the
routed FLOPs over the measured matmul rate.

``--sweep`` also times every tile shape of ``SWEEP`` per case and prints the
best three with their max difference from the default's output (the values
to put in ``moe_tiles._TILE_TABLE``, or to try as ``OCTAVO_MOE_TILES``);
``--down-sweep`` the grouped down kernel's own tiles (``DOWN_SWEEP``, to
try as ``OCTAVO_MOE_GROUPED_DOWN_TILES``).

Up to 8 tokens, the decode form (``moe_decode.py``: no alignment, the sum
over top-k in the down kernel) and the grouped GEMMs are timed side by side
(rows ``decode`` and ``grouped``; ``--decode-tiles`` sweeps the down
kernel's ``OCTAVO_MOE_DOWN_TILES``), and at 1 token the whole MoE block as
a decode step runs it (rows ``block``): router product, top-k softmax and
experts, before (cuBLAS router, grouped path: 7 launches), routed (the
GEMV router, the experts' kernels picking the experts: 3) and after (the
GEMV router, the decode form: 4).

The alignment alone is timed in each form (rows ``align``: the chunked kernel, a program
per 64 slots, at any size, past ``CHUNKED_ALIGN_MAX_SLOTS`` too, where the
engine takes the sort; torch's sort; one program up to 1,024 slots), each
checked equal to the sort's.

GPU times are medians with the L2 flushed before each run; the kernel is
replayed from a CUDA graph (as decode steps run it), the reference is not
(it syncs on the routing). ``--smoke`` runs tiny shapes on the CPU (Triton
interpreter) to check that the script works. With ``$OUT`` set, the table
also goes to ``$OUT/moe_gpu.log`` and every number to ``$OUT/moe_gpu.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from octavo.benchmarks.ceilings import measure_ceilings  # noqa: E402
from octavo.kernels.fused_moe import MoeTiles, fused_moe, moe_tiles  # noqa: E402
from octavo.kernels.moe_tiles import DownTiles  # noqa: E402
from octavo.kernels.fused_moe_gemv import DEFAULT_TILES as DEFAULT_GEMV_TILES  # noqa: E402
from octavo.kernels.fused_moe_gemv import fused_moe_gemv, moe_gemv_tiles  # noqa: E402
from octavo.kernels.gemv import linear_gemv  # noqa: E402
from octavo.kernels.moe_align import align_to_experts, align_to_experts_torch  # noqa: E402
from octavo.kernels.moe_decode import down_topk_sum  # noqa: E402
from octavo.kernels.moe_routed import fused_moe_routed  # noqa: E402
from octavo.kernels.moe_topk import topk_softmax  # noqa: E402
from octavo.ops.reference import fused_moe as fused_moe_reference  # noqa: E402
from octavo.ops.reference import moe_topk_softmax  # noqa: E402

MODELS = ("qwen3-30b-a3b", "mixtral-8x7b")
TOKENS = (1, 8, 64, 512, 4096)
SWEEP = [MoeTiles(m, n, k, w, s) for m in (16, 32, 64, 128) for n in (64, 128) for k in (64, 128)
         for w in (4, 8) for s in (3, 4)]
# The grouped down kernel's own tiles (``--down-sweep``; the gate-up's at its default): K is the
# expert width, and every column tile re-reads the block's activation rows.
DOWN_SWEEP = [DownTiles(n, k, w, s) for n in (64, 128, 256) for k in (64, 128, 256) for w in (4, 8) for s in (2, 3, 4)]
LOG_LINES: list[str] = []
RECORDS: list[dict] = []


@dataclass(frozen=True)
class MoeShape:
    name: str
    experts: int
    top_k: int
    hidden: int
    inter: int


def say(line: str = "") -> None:
    print(line, flush=True)
    LOG_LINES.append(line)


def shape_of(model: str) -> MoeShape:
    config = json.loads((REPO / "benchmarks" / "configs" / model / "config.json").read_text())
    experts = config.get("num_experts") or config["num_local_experts"]
    inter = config.get("moe_intermediate_size") or config["intermediate_size"]
    return MoeShape(model, experts, config["num_experts_per_tok"], config["hidden_size"], inter)


def smoke_shape() -> MoeShape:
    return MoeShape("tiny", 8, 2, 32, 16)


def time_us(fn, device: torch.device, use_graph: bool, reps: int) -> float:
    """Median time of ``fn`` in microseconds (GPU: events, L2 flushed; CPU: one wall-clock run)."""
    if device.type != "cuda":
        started = time.perf_counter()
        fn()
        return 1e6 * (time.perf_counter() - started)
    sys.path.insert(0, str(REPO / "benchmarks"))
    from kernels_gpu import time_us as gpu_time_us

    return gpu_time_us(fn, use_graph=use_graph, reps=reps)


def make_weights(shape: MoeShape, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's experts ``(w13, w2)``, made on the device (Mixtral's are 2.8 GB)."""
    gen = torch.Generator(device).manual_seed(0)
    w13 = torch.randn(shape.experts, 2 * shape.inter, shape.hidden, generator=gen, device=device, dtype=dtype)
    w2 = torch.randn(shape.experts, shape.hidden, shape.inter, generator=gen, device=device, dtype=dtype)
    return w13.mul_(shape.hidden**-0.5), w2.mul_(shape.inter**-0.5)


def make_inputs(shape: MoeShape, num_tokens: int, experts: tuple, device: torch.device, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(num_tokens)
    x = torch.randn(num_tokens, shape.hidden, generator=gen).to(device, dtype)
    logits = torch.randn(num_tokens, shape.experts, generator=gen).to(device)
    weights, ids = moe_topk_softmax(logits, shape.top_k, True)
    return x, *experts, weights, ids


def floor_us(shape: MoeShape, ids: torch.Tensor, num_tokens: int, ceilings, dtype: torch.dtype) -> tuple[float, int]:
    """The step's floor (microseconds) and the number of experts it reads."""
    routed = int(torch.unique(ids).numel())
    size = torch.empty((), dtype=dtype).element_size()
    weight_bytes = routed * 3 * shape.hidden * shape.inter * size
    activation_bytes = num_tokens * shape.hidden * size * 2 + num_tokens * shape.top_k * (shape.inter + shape.hidden) * size * 2
    flops = 2 * num_tokens * shape.top_k * 3 * shape.hidden * shape.inter
    seconds = max((weight_bytes + activation_bytes) / ceilings.copy_bytes_per_s,
                  flops / ceilings.matmul_rate(str(dtype).removeprefix("torch.")))
    return 1e6 * seconds, routed


def sweep_case(case: dict, inputs, expected: torch.Tensor, device: torch.device, reps: int) -> list[tuple[float, MoeTiles, float]]:
    results = []
    for tiles in SWEEP:
        try:
            out = fused_moe(*inputs, "silu", tiles)
            us = time_us(lambda tiles=tiles: fused_moe(*inputs, "silu", tiles), device, True, reps)
        except Exception as exc:  # a tile shape the GPU cannot run (shared memory): skip it
            say(f"    {tiles}: {type(exc).__name__}")
            continue
        results.append((us, tiles, float((out.float() - expected.float()).abs().max())))
        RECORDS.append({**case, "sweep_tiles": asdict(tiles), "us": us})
    return sorted(results, key=lambda r: r[0])


def down_sweep_case(case: dict, inputs, expected: torch.Tensor, device: torch.device, reps: int) -> None:
    """The grouped path with each of ``DOWN_SWEEP``'s down tiles; the best three."""
    results = []
    for down in DOWN_SWEEP:
        try:
            out = fused_moe(*inputs, "silu", None, False, down)
            us = time_us(lambda down=down: fused_moe(*inputs, "silu", None, False, down), device, True, reps)
        except Exception as exc:  # a tile shape the GPU cannot run (shared memory): skip it
            say(f"    {down}: {type(exc).__name__}")
            continue
        results.append((us, down, float((out.float() - expected.float()).abs().max())))
        RECORDS.append({**case, "down_sweep_tiles": asdict(down), "us": us})
    for us, down, diff in sorted(results, key=lambda r: r[0])[:3]:
        say(f"{'':>14} down {us:>10.1f} us (max diff {diff:.1e})  "
            f"OCTAVO_MOE_GROUPED_DOWN_TILES={down.block_n},{down.block_k},{down.num_warps},{down.num_stages}")


GEMV_MAX_TOKENS = 8
# Each GEMV's tiles swept with the other's at its default: the gate-up's, then
# the down's (narrower column tiles there: one program per token and tile).
_GATE_UP_SWEEP = [(n, k, w) for n in (4, 8, 16, 32) for k in (128, 256, 512) for w in (2, 4, 8)]
_DOWN_SWEEP = [(n, k, w) for n in (1, 2, 4, 8, 16) for k in (128, 256) for w in (1, 2, 4)]
GEMV_SWEEP = [(*t, *DEFAULT_GEMV_TILES[3:]) for t in _GATE_UP_SWEEP] + [(*DEFAULT_GEMV_TILES[:3], *t) for t in _DOWN_SWEEP]


def run_gemv(shape: MoeShape, num_tokens: int, inputs, reference, floor: float, args, device) -> None:
    """The decode path (fused_moe_gemv: two GEMVs, no alignment) beside the grouped GEMMs."""
    tiles_list = GEMV_SWEEP if args.sweep else [moe_gemv_tiles()]
    if args.smoke:
        tiles_list = tiles_list[:2]
    timed = []
    for tiles in tiles_list:
        try:
            out = fused_moe_gemv(*inputs, 0, tiles)
            us = time_us(lambda tiles=tiles: fused_moe_gemv(*inputs, 0, tiles), device, True, args.reps)
        except Exception as exc:  # a tile shape the GPU cannot run: skip it
            say(f"    gemv {tiles}: {type(exc).__name__}")
            continue
        timed.append((us, tiles, float((out.float() - reference.float()).abs().max())))
        RECORDS.append({"model": shape.name, "tokens": num_tokens, "gemv_tiles": tiles, "gemv_us": us})
    for us, tiles, error in sorted(timed)[:3]:
        say(f"{'':>14} {num_tokens:>6} {'gemv':>9} {us:>10.1f} {'':>10} {floor:>9.1f} {us / floor:>7.2f}x "
            f"{'':>8}  {error:.1e}  gate-up, down (block_n, block_k, warps) = {tiles[:3]}, {tiles[3:]}")


DECODE_MAX_TOKENS = 8
DOWN_TILES_SWEEP = [(n, w) for n in (1, 2, 4, 8, 16) for w in (2, 4, 8)]
# Pipelined by Triton (round 40, never timed): the K loop's loads through shared memory.
DOWN_TILES_SWEEP += [(n, w, st) for n, w, st in ((4, 4, 2), (4, 4, 3), (8, 4, 3), (2, 4, 3), (4, 8, 3))]


def run_decode(shape: MoeShape, num_tokens: int, inputs, reference, floor: float, args, device) -> None:
    """The decode form beside the grouped GEMMs at the same tiles (both forced)."""
    for name, decode in (("decode", True), ("grouped", False)):
        out = fused_moe(*inputs, "silu", None, decode)
        us = time_us(lambda decode=decode: fused_moe(*inputs, "silu", None, decode), device, True, args.reps)
        error = float((out.float() - reference.float()).abs().max())
        say(f"{'':>14} {num_tokens:>6} {name:>9} {us:>10.1f} {'':>10} {floor:>9.1f} {us / floor:>7.2f}x {'':>8}  {error:.1e}")
        RECORDS.append({"model": shape.name, "tokens": num_tokens, "form": name, "us": us, "max_error": error})
    if not args.decode_tiles:
        return
    x, w13, w2, weights, ids = inputs
    act = torch.randn(ids.numel(), shape.inter, device=device, dtype=x.dtype)
    timed = []
    for tiles in DOWN_TILES_SWEEP[: 2 if args.smoke else None]:
        us = time_us(lambda tiles=tiles: down_topk_sum(act, w2, weights, ids, tiles), device, True, args.reps)
        timed.append((us, tiles))
        RECORDS.append({"model": shape.name, "tokens": num_tokens, "down_tiles": tiles, "down_us": us})
    for us, tiles in sorted(timed)[:3]:
        say(f"{'':>14} {num_tokens:>6} {'down':>9} {us:>10.1f}  OCTAVO_MOE_DOWN_TILES={','.join(map(str, tiles))}")


def run_align(shape: MoeShape, num_tokens: int, ids: torch.Tensor, block_m: int, args, device) -> None:
    """The expert alignment alone, each form (a graph replay: its launches as a step runs them)."""
    # The chunked kernel at any size (past CHUNKED_ALIGN_MAX_SLOTS too: whether prefill should take it).
    forms = {"chunked": lambda: align_to_experts(ids, shape.experts, block_m, True, max_slots=ids.numel()),
             "torch sort": lambda: align_to_experts_torch(ids, shape.experts, block_m)}
    if ids.numel() <= 1024:
        forms["one program"] = lambda: align_to_experts(ids, shape.experts, block_m, False)
    expected = align_to_experts_torch(ids, shape.experts, block_m)
    for name, fn in forms.items():
        same = torch.equal(fn().sorted_slots, expected.sorted_slots)
        us = time_us(fn, device, True, args.reps)
        say(f"{'':>14} {num_tokens:>6} {'align':>9} {us:>10.1f}  {name}{'' if same else ' (DIFFERS from the sort)'}")
        RECORDS.append({"model": shape.name, "tokens": num_tokens, "align": name, "us": us, "same": same})


def run_block(shape: MoeShape, experts: tuple, args, device: torch.device, dtype: torch.dtype) -> None:
    """One token through the MoE block as a decode step runs it (router, top-k, experts), before and after."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1, shape.hidden, generator=gen).to(device, dtype)
    router = (torch.randn(shape.experts, shape.hidden, generator=gen) * shape.hidden**-0.5).to(device, dtype)

    def before() -> torch.Tensor:
        weights, ids = topk_softmax(torch.nn.functional.linear(x, router), shape.top_k, True)
        return fused_moe(x, *experts, weights, ids, "silu", None, False)

    def after() -> torch.Tensor:
        weights, ids = topk_softmax(linear_gemv(x, router, None), shape.top_k, True)
        return fused_moe(x, *experts, weights, ids, "silu", None, True)

    def routed() -> torch.Tensor:  # the fused_moe_routed op: the experts' kernels pick the experts
        return fused_moe_routed(x, *experts, linear_gemv(x, router, None), shape.top_k, True, "silu")

    results = {}
    for name, fn, launches in (("before", before, 7), ("after", after, 4), ("routed", routed, 3)):
        results[name] = fn()
        us = time_us(fn, device, True, args.reps)
        say(f"{shape.name:>14} {1:>6} {'block':>9} {us:>10.1f}  {name}: router, top-k and experts, {launches} launches")
        RECORDS.append({"model": shape.name, "tokens": 1, "block": name, "us": us})
    for name in ("after", "routed"):
        difference = float((results[name].float() - results["before"].float()).abs().max())
        say(f"{'':>14} block max |{name} - before| {difference:.1e}")


def run_case(shape: MoeShape, num_tokens: int, experts: tuple, args, device: torch.device, dtype: torch.dtype,
             ceilings) -> None:
    inputs = make_inputs(shape, num_tokens, experts, device, dtype)
    tiles = moe_tiles(num_tokens, shape.top_k, shape.experts)
    ours = fused_moe(*inputs, "silu")
    reference = fused_moe_reference(*inputs, "silu")
    error = float((ours.float() - reference.float()).abs().max())
    kernel_us = time_us(lambda: fused_moe(*inputs, "silu"), device, True, args.reps)
    reference_us = time_us(lambda: fused_moe_reference(*inputs, "silu"), device, False, max(3, args.reps // 5))
    floor, routed = floor_us(shape, inputs[4], num_tokens, ceilings, dtype)
    say(f"{shape.name:>14} {num_tokens:>6} {routed:>4}/{shape.experts:<4} {kernel_us:>10.1f} {reference_us:>10.1f} "
        f"{floor:>9.1f} {kernel_us / floor:>7.2f}x {reference_us / kernel_us:>7.1f}x  {error:.1e}  {tiles}")
    RECORDS.append({"model": shape.name, "tokens": num_tokens, "routed_experts": routed, "kernel_us": kernel_us,
                    "reference_us": reference_us, "floor_us": floor, "max_error": error, "tiles": asdict(tiles)})
    if num_tokens <= DECODE_MAX_TOKENS:
        run_decode(shape, num_tokens, inputs, reference, floor, args, device)
    run_align(shape, num_tokens, inputs[4], tiles.block_m, args, device)
    if num_tokens <= GEMV_MAX_TOKENS and not args.skip_gemv:
        run_gemv(shape, num_tokens, inputs, reference, floor, args, device)
    if args.down_sweep and num_tokens > DECODE_MAX_TOKENS:
        down_sweep_case({"model": shape.name, "tokens": num_tokens}, inputs, ours, device, args.reps)
    if args.sweep:
        best = sweep_case({"model": shape.name, "tokens": num_tokens}, inputs, ours, device, args.reps)
        for us, candidate, diff in best[:3]:
            say(f"{'':>14} sweep {us:>10.1f} us ({us / floor:.2f}x floor, max diff {diff:.1e})  {candidate}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="comma-separated token counts")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--sweep", action="store_true", help="also time every tile shape of SWEEP")
    parser.add_argument("--tiles", default=None,
                        help="with --sweep: these tile shapes instead of SWEEP, 'm,n,k,warps,stages;...'")
    parser.add_argument("--decode-tiles", action="store_true", help="also sweep the decode form's down tiles")
    parser.add_argument("--down-sweep", action="store_true",
                        help="also sweep the grouped down kernel's own tiles (past the decode sizes)")
    parser.add_argument("--skip-gemv", action="store_true", help="leave out the two-GEMV path (off by default)")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (set TRITON_INTERPRET=1)")
    args = parser.parse_args(argv)
    device = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    global SWEEP
    if args.tiles:
        SWEEP = [MoeTiles(*(int(v) for v in part.split(","))) for part in args.tiles.split(";") if part.strip()]
    if args.smoke:
        SWEEP = SWEEP[:2]
        DOWN_SWEEP[2:] = []
    shapes = [smoke_shape()] if args.smoke else [shape_of(m) for m in args.models.split(",")]
    ceilings = measure_ceilings(device, [str(dtype).removeprefix("torch.")])
    say(f"fused MoE, one layer, {dtype}, silu, routing renormalised; device {ceilings.describe()}")
    say(f"{'model':>14} {'tokens':>6} {'experts':>9} {'kernel us':>10} {'ref us':>10} {'floor us':>9} "
        f"{'/floor':>8} {'ref/ker':>8}  max err  tiles")
    for shape in shapes:
        experts = make_weights(shape, device, dtype)
        for num_tokens in (int(t) for t in args.tokens.split(",")):
            run_case(shape, num_tokens, experts, args, device, dtype, ceilings)
        if 1 in (int(t) for t in args.tokens.split(",")):
            run_block(shape, experts, args, device, dtype)
        del experts
    if out := os.environ.get("OUT"):
        Path(out, "moe_gpu.log").write_text("\n".join(LOG_LINES) + "\n")
        Path(out, "moe_gpu.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
