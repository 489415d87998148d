#!/usr/bin/env python
"""Tile sweep of the quantized GEMM kernels at Llama-3.1-8B shapes: ``python benchmarks/quant_sweep_gpu.py``.

For each kernel whose tiles are parameters, every config of its sweep list
at the token counts that decide its defaults; the time of one decoder
layer's four projections (qkv, o, gate_up, down), GPU median with the L2
flushed, replayed from a CUDA graph:

- ``fp8 gemv`` (``gemv.GemvConfig``, 8-bit weight + per-channel scale) at 1, 2 tokens;
- ``int4 gemv`` (``GroupedGemvConfig``) at 1, 2; ``int4 tc_mm``
  (``GroupedMmConfig``, split-K and K step included) at 16, 64, 256, 512;
  ``int4 dequant+cublas`` (``DequantTile``) at 512;
- ``gguf_Q4_K`` / ``gguf_Q6_K`` ``gemv`` (``GGUFGemvConfig``) and ``gemv_pairs`` at 1;
  ``tile_mm`` (``GGUFMmConfig``) at 16, 64;
- ``fp8_block gemv`` / ``block_mm`` (``BlockGemvConfig``, ``BlockMmConfig``) at 1 and 64, 512.

Prints, per (kernel, tokens), the default config's time, the best three
and the bytes-over-time bandwidth of the best, and at the end one line per
kernel with the config to make the default. Kernels compile first in a
pool of processes (Triton's disk cache). ``SWEEP_BUDGET_S`` bounds the
timing; cases left over are skipped and say so. With ``$OUT`` set, writes
``quant_sweep.jsonl`` there.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import quant_paths as qp  # noqa: E402
from kernels_gpu import copy_bandwidth, time_us  # noqa: E402
from kernels_gpu_sweep import compile_in_pool  # noqa: E402

from octavo.kernels.gemv import GemvConfig  # noqa: E402
from octavo.kernels.quant.fp8_block_triton import BlockGemvConfig, BlockMmConfig  # noqa: E402
from octavo.kernels.quant.gguf_triton import GGUFGemvConfig, GGUFMmConfig  # noqa: E402
from octavo.kernels.quant.fp8_gemv_rows import Fp8RowsTiles  # noqa: E402
from octavo.kernels.quant.bf16_pairs import PairsTiles  # noqa: E402
from octavo.kernels.quant.int4_gemv_dp4a import Dp4aTiles  # noqa: E402
from octavo.kernels.quant.int4_gemv_rows import RowsTiles  # noqa: E402
from octavo.kernels.quant.int4_triton import DequantTile, GroupedGemvConfig, GroupedMmConfig  # noqa: E402
from octavo.kernels.quant.int4_mm_triton import mm_env_value  # noqa: E402
from octavo.kernels.quant.skinny_8bit import SkinnyConfig  # noqa: E402

SWEEP_BUDGET_S = 180.0
REPS = 15
GEMV_8BIT = [GemvConfig(n, k, w, 2, True, p) for n in (2, 4, 8) for k in (1024, 2048, 4096) for w in (4, 8)
             for p in (False, True)]
# Pipelined by Triton: the loop's loads through shared memory, stages - 1 steps ahead (sm_90 at
# (8, 1024, 4): 5.1 instructions a value against 4.7). H100, round 40: 161-191 us against 116-117.
GEMV_8BIT += [GemvConfig(n, k, w, st, True, pipelined=True) for n, k, w, st in (
    (8, 1024, 4, 3), (4, 1024, 4, 4), (4, 1024, 4, 3), (8, 512, 4, 4), (4, 512, 4, 4), (2, 1024, 4, 4), (8, 512, 8, 3))]
# The 8-bit tensor-core skinny kernel (skinny_8bit.py): split 0 = fill the SMs twice.
SKINNY_8BIT = [SkinnyConfig(n, k, sp, w, st) for n in (32, 64, 128) for k in (128, 256, 512) for sp in (0, 4)
               for w in (4,) for st in (3, 4, 6)]
# Blocks up to 32 (8 KiB of int4 a program per step at block_n 4): the 16-bit GEMV
# needed wide K tiles to keep enough loads in flight (round 16); int4's default reads 1 KiB.
# The deferred kernel (every Llama shape: groups of whole layout blocks) with one
# or two row groups a program; the per-plane kernel once, as its reference.
INT4_GEMV = [
    GroupedGemvConfig(n, b, w, True, r) for n in (1, 2, 4, 8) for b in (4, 8, 16, 32) for w in (4, 8) for r in (1, 2)
] + [GroupedGemvConfig(4, 8, 4, False)] + [
    # The shared-activation form (round 26's loop).
    GroupedGemvConfig(n, b, w, True, 1, True) for n in (2, 4, 8) for b in (4, 8, 16) for w in (4, 8)
]
# The one-token int4 GEMV with rows a thread (int4_gemv_rows): rows a program,
# 128-input blocks a step (one per warp slice), warps.
INT4_ROWS = [RowsTiles(n, s, w) for n, s, w in (
    (8, 8, 8), (16, 8, 8), (16, 4, 4), (32, 4, 8), (8, 4, 4), (16, 16, 8), (16, 8, 16), (32, 8, 8), (16, 2, 2),
    (8, 16, 8), (4, 8, 4), (32, 2, 4), (64, 2, 8), (16, 4, 8), (8, 2, 2), (32, 4, 4),
    # Round 35 (H200): fewer rows a program and more blocks a step won ((8, 16, 8) 76.8 us,
    # (4, 8, 4) 78.6): further along that line.
    (4, 16, 8), (4, 32, 8), (8, 32, 8), (4, 16, 4), (2, 16, 4), (2, 32, 4), (8, 32, 16), (4, 32, 16))]
# The float32 form (one value an instruction), round 33's default, for the comparison.
INT4_ROWS += [RowsTiles(8, 8, 8, 0), RowsTiles(16, 8, 8, 0)]
# Prefetching: the next step's weights loaded before this step's arithmetic, twice the bytes in
# flight a thread (sm_90: 4.06 instructions a value at (8, 8, 8)). H100, round 40: 97-142 us, slower.
INT4_ROWS += [RowsTiles(n, s, w, 1, 1) for n, s, w in (
    (8, 8, 8), (8, 4, 4), (4, 8, 4), (8, 16, 8), (4, 16, 8), (8, 2, 2), (4, 4, 4), (16, 8, 8), (8, 8, 4))]
# Pipelined by Triton: every load of the loop through shared memory, stages - 1 steps ahead (sm_90
# at (8, 8, 8): 5.2-5.3 instructions a value, two barriers a step). H100, round 40: 101-153 us, slower.
INT4_ROWS += [RowsTiles(n, s, w, 1, 0, st) for n, s, w, st in (
    (8, 8, 8, 3), (8, 8, 8, 4), (8, 4, 4, 3), (8, 4, 4, 4), (8, 2, 2, 4), (4, 8, 4, 4), (16, 8, 8, 3), (8, 16, 8, 3),
    (4, 4, 4, 4), (8, 4, 8, 4))]
# The one-token W4A8 GEMV (int4_gemv_dp4a): rows a program, blocks a step, warps. sm_90
# loops: (8, 16, 8) 1.5 instructions a value, barrier-free; 16 rows or 32 blocks 1.15-1.2
# with a trip through shared memory.
INT4_DP4A = [Dp4aTiles(n, s, w) for n, s, w in (
    (8, 16, 8), (8, 8, 8), (4, 16, 4), (16, 16, 8), (8, 32, 8), (8, 16, 4), (4, 8, 4), (16, 8, 8), (4, 32, 8),
    (2, 16, 4), (8, 8, 4), (16, 16, 16))]
# block_k: inputs per K step (one dequantized tile, one tl.dot); swap_ab: W x^T, so
# that 16-32 token tiles run on wgmma. Tiles past the H200's 227 KiB of shared memory
# (block_k 256 with M or N 128+ at 3-4 stages) fail to launch and drop out.
INT4_MM_SKINNY = [
    GroupedMmConfig(m, n, s, 8, 4, st, k, swap)
    for m, n in ((16, 64), (16, 128), (32, 64), (32, 128)) for s in (1, 2, 4, 8) for st in (3, 4)
    for k, swap in ((128, False), (128, True), (256, True))
]
# The weight tile in bfloat16 pairs (int4_pairs_tile). sm_90 loops, instructions a value: W x^T
# 4.2 (its tile goes to wgmma's registers through shared memory in eight barrier-fenced chunks);
# x W^T on mma.sync 3.16 at (16, 128, 128; 4 warps), 2.98 at 256-input steps, against 3.9 for the
# one-token rows GEMV and 6.65 for the float32 tile: wide tiles, split-K automatic (0) or fixed.
# H100, round 41: best 160.0 / 161.2 / 298.9 us at 1 / 16 / 64 tokens against the float32 tile's
# 145.6 / 149.6 / 250.4 (W x^T); at 256 tokens (INT4_MM_WIDE) 467.6 against 484.1 (default).
INT4_MM_SKINNY += [
    GroupedMmConfig(m, n, s, 8, w, 3, k, pairs=True)
    for m, n in ((16, 128), (16, 256), (32, 128)) for k in (128, 256) for s in (0, 4) for w in (4, 8)
] + [GroupedMmConfig(16, 64, 0, 8, 4, 4, 128, pairs=True), GroupedMmConfig(16, 128, 0, 8, 4, 4, 128, True, True)]
INT4_MM_WIDE = [
    GroupedMmConfig(m, n, 1, 8, w, st, k)
    for m in (64, 128) for n in (128, 256) for k in (128, 256) for w in (4, 8) for st in (3, 4)
]
INT4_MM_WIDE += [GroupedMmConfig(m, n, 1, 8, w, 3, 128, pairs=True) for m, n in ((64, 128), (128, 128), (128, 256))
                 for w in (4, 8)]
INT4_DEQUANT = [DequantTile(r, k, w) for r in (8, 16, 32) for k in (256, 512, 1024) for w in (4, 8)]
# One and two warps: the one-token kernel's per-super-block scale work is per
# thread, so fewer threads a row each take more values (sm_90 loop, Q4_K: 9.3
# instructions a value at (8, 1, 1), 19 at (4, 1, 4)).
GGUF_GEMV = [GGUFGemvConfig(n, s, w) for n in (2, 4, 8, 16) for s in (1, 2, 4) for w in (1, 2, 4)]
# The one-token fp8 GEMV with activations shared by rows: rows a program, 128-value chunks
# a step, warps (16 rows with 4 warps change layout every step: left out).
FP8_ROWS = [Fp8RowsTiles(n, s, w) for n, s, w in (
    (32, 2, 4), (32, 1, 4), (64, 1, 4), (64, 2, 4), (128, 2, 8), (64, 1, 8), (128, 1, 8), (32, 1, 2), (64, 2, 8),
    (128, 1, 4), (32, 2, 8), (64, 4, 8))]
# The Q4_K GEMV in bfloat16 pairs: rows a program (rows a thread = block_n * 32 / threads),
# super-blocks a step, warps.
GGUF_Q4K_PAIRS = [PairsTiles(n, s, w) for n, s, w in (
    (32, 1, 4), (16, 1, 4), (8, 1, 4), (64, 1, 4), (16, 2, 4), (32, 2, 4), (8, 2, 4), (32, 1, 8), (64, 1, 8),
    (16, 1, 2), (8, 1, 2), (16, 1, 1), (32, 2, 8), (64, 2, 8), (16, 4, 8), (8, 4, 4),
    # Round 35 (H200): (8, 4, 4) 96.9 us, the best; around it.
    (4, 4, 4), (8, 8, 4), (4, 8, 4), (8, 8, 8), (8, 4, 8), (4, 4, 2), (4, 8, 8), (8, 16, 8))]
# Pipelined by Triton: the default's loop has 12 barriers a step (layout changes), two with
# stages (sm_90 at (8, 4, 4): 6.8 instructions a value against 5.8). H100, round 40: 112-144 us, slower.
GGUF_Q4K_PAIRS += [PairsTiles(n, s, w, st) for n, s, w, st in (
    (8, 4, 4, 3), (8, 2, 4, 3), (8, 2, 4, 4), (8, 1, 4, 4), (4, 4, 4, 3), (8, 1, 2, 4), (16, 2, 8, 3), (4, 2, 4, 4))]
# The Q6_K GEMV in bfloat16 pairs: 16 lanes a super-block, rows a program, super-blocks a step,
# warps[, stages] (sm_90 at (8, 4, 4): 6.4 instructions a value). H100, round 40: 188-196 us.
GGUF_Q6K_PAIRS = [PairsTiles(*t) for t in (
    (8, 4, 4), (8, 2, 4), (4, 4, 4), (8, 8, 4), (16, 2, 4), (8, 1, 4), (4, 8, 4), (8, 4, 8), (16, 4, 8), (4, 2, 2),
    (8, 2, 4, 3), (8, 1, 4, 4), (4, 4, 4, 3), (8, 4, 4, 3))]
# The one-token W4A8 Q4_K GEMV (gguf_q4k_dp4a): rows a program, super-blocks a step, warps.
# sm_90 loop at (8, 4, 4): 2.7 instructions a value (the pairs GEMV 5.4), barrier-free.
GGUF_Q4K_DP4A = [Dp4aTiles(*t) for t in (
    (8, 4, 4), (8, 2, 4), (4, 4, 4), (8, 8, 4), (16, 4, 8), (8, 4, 8), (4, 8, 4), (16, 2, 4), (8, 1, 4), (4, 2, 2))]
GGUF_MM = [GGUFMmConfig(m, n, 8, 4, s) for m, n in ((16, 32), (16, 64), (32, 64), (64, 64), (64, 128)) for s in (1, 2)]
BLOCK_GEMV = [BlockGemvConfig(n, s, w) for n in (4, 8, 16, 32) for s in (2, 4, 8) for w in (2, 4)]
BLOCK_MM = [BlockMmConfig(m, n, 8, w, 3) for m, n in ((16, 64), (32, 128), (64, 128), (128, 128)) for w in (4, 8)]
# (family, path, tokens, configs): ~420 kernels, ~5 minutes on the H200.
PLAN = [
    ("fp8", "gemv", (1, 2), GEMV_8BIT),
    ("fp8", "gemv_rows", (1,), FP8_ROWS),
    ("fp8", "skinny", (1, 16), SKINNY_8BIT),
    ("fp8", "skinny_w8a8", (1, 16), SKINNY_8BIT),
    ("int4", "gemv", (1, 2), INT4_GEMV),
    ("int4", "gemv_rows", (1,), INT4_ROWS),
    ("int4", "gemv_dp4a", (1,), INT4_DP4A),
    ("int4", "torch_int4pack_mm", (1,), []),  # tinygemm, for comparison
    ("int4", "tc_mm", (1, 16, 64), INT4_MM_SKINNY),
    ("int4", "tc_mm", (256, 512), INT4_MM_WIDE),
    ("int4", "dequant+cublas", (512,), INT4_DEQUANT),
    ("gguf_Q4_K", "gemv", (1,), GGUF_GEMV),
    ("gguf_Q4_K", "gemv_pairs", (1,), GGUF_Q4K_PAIRS),
    ("gguf_Q4_K", "gemv_dp4a", (1,), GGUF_Q4K_DP4A),
    ("gguf_Q6_K", "gemv", (1,), GGUF_GEMV),
    ("gguf_Q6_K", "gemv_pairs", (1,), GGUF_Q6K_PAIRS),
    ("gguf_Q4_K", "tile_mm", (16, 64), GGUF_MM),
    ("fp8_block", "gemv", (1,), BLOCK_GEMV),
    ("fp8_block", "block_mm", (64, 512), BLOCK_MM),
]
RECORDS: list[dict] = []


def say(line: str = "") -> None:
    print(line, flush=True)


def time_config(path: qp.Path, weights: dict, num_tokens: int, config, reference: dict | None = None) -> float | None:
    """Microseconds for the four shapes, or None where the config cannot run or (``reference``:
    the default config's outputs, which it fills when empty) computes something else."""
    total = 0.0
    for index, (shape, num_in, _) in enumerate(qp.SHAPES):
        generator = torch.Generator(device=qp.DEVICE).manual_seed(index)
        x = torch.randn(num_tokens, num_in, device=qp.DEVICE, dtype=qp.DTYPE, generator=generator)
        try:
            fn = path.make(weights[shape], config)
            out = fn(x)
        except Exception:  # noqa: BLE001 -- a config the kernel cannot take (registers, shared memory)
            return None
        if reference is not None and not _agrees(reference, shape, out, config):
            return None
        total += time_us(lambda fn=fn, x=x: fn(x), reps=REPS)
    return total


def _agrees(reference: dict, shape: str, out: torch.Tensor, config) -> bool:
    """Whether ``out`` matches the default config's output for ``shape`` (the first call stores it)."""
    if shape not in reference:
        reference[shape] = out.float()
        return True
    error = float((out.float() - reference[shape]).norm() / reference[shape].norm().clamp_min(1e-30))
    if error > 2e-2:
        say(f"    wrong result ({shape}: relative error {error:.1e}), left out: {config}")
        return False
    return True


def sweep_case(family: str, name: str, num_tokens: int, configs: list, weights: dict, bandwidth: float) -> object:
    path = qp.path_by_label(family, name)
    reference: dict = {}  # each config's outputs against the default's (a miscompiled tile must not win)
    default_us = time_config(path, weights, num_tokens, None, reference)
    results = []
    for config in configs:
        us = time_config(path, weights, num_tokens, config, reference)
        if us is not None:
            results.append((us, config))
            RECORDS.append({"family": family, "path": name, "tokens": num_tokens, "config": asdict(config), "us": us})
    results.sort(key=lambda r: r[0])
    nbytes = sum(qp.weight_bytes(w) for w in weights.values())
    say(f"{family} {name} M={num_tokens}: default {default_us or float('nan'):.1f} us; {len(results)}/{len(configs)} configs ran")
    for us, config in results[:3]:
        say(f"    {us:8.1f} us  {nbytes / (us * 1e-6) / 1e12:5.2f} TB/s (copy {bandwidth / 1e12:.2f})  {config}")
    if results and default_us is not None and default_us <= results[0][0]:
        # Round 33 exported such a config to an end-to-end run: read this line before using the env file.
        say(f"    the default ({default_us:.1f} us) is as fast as the best config listed: keep the default")
    return results[0][1] if results else None


def precompile(plan=PLAN) -> None:
    jobs = [(family, name, m, config) for family, name, tokens, configs in plan for m in tokens for config in [None, *configs]]
    compile_in_pool(qp.compile_job, jobs, say, time.perf_counter(), chunksize=4)


def run(plan=PLAN, budget_s: float = SWEEP_BUDGET_S) -> dict:
    bandwidth = copy_bandwidth()
    started, best, generator = time.perf_counter(), {}, torch.Generator().manual_seed(0)
    weights_by_family: dict[str, dict] = {}
    for family, name, tokens, configs in plan:
        if family not in weights_by_family:
            weights_by_family.clear()
            weights_by_family[family] = {s: qp.make_weights(family, n, k, generator) for s, k, n in qp.SHAPES}
        for num_tokens in tokens:
            if time.perf_counter() - started > budget_s:
                say(f"{family} {name} M={num_tokens}: skipped (sweep budget of {budget_s:.0f} s spent)")
                continue
            best[(family, name, num_tokens)] = sweep_case(family, name, num_tokens, configs, weights_by_family[family], bandwidth)
    say("\nbest configs (set as defaults where they beat the default above):")
    for (family, name, num_tokens), config in best.items():
        say(f"  {family} {name} M={num_tokens}: {config}")
    return best


# The one-token winners as the environment overrides the kernels read
# (``--env-file``): an end-to-end run in the same device call uses them.
ENV_OVERRIDES = {
    ("int4", "gemv"): ("OCTAVO_INT4_GEMV_TILES",
                       lambda c: f"{c.block_n},{c.blocks},{c.num_warps},{int(c.deferred)},{c.row_groups},{int(c.shared_inputs)}"),
    ("int4", "gemv_rows"): ("OCTAVO_INT4_GEMV_ROWS_TILES",
                            lambda c: f"{c.block_n},{c.split},{c.num_warps},{c.packed},{c.prefetch},{c.stages}"),
    ("int4", "gemv_dp4a"): ("OCTAVO_INT4_DP4A_TILES", lambda c: f"{c.block_n},{c.split},{c.num_warps}"),
    ("fp8", "gemv"): ("OCTAVO_GEMV_8BIT",
                      lambda c: f"{c.block_n},{c.block_k},{c.num_warps},{c.num_stages},{int(c.defer_reduce)},{int(c.prefetch)},"
                                f"{int(c.pipelined)}"),
    ("int4", "tc_mm"): ("OCTAVO_INT4_MM_TILES", mm_env_value),
    ("fp8", "skinny_w8a8"): ("OCTAVO_SKINNY_8BIT_TILES",
                             lambda c: f"{c.block_n},{c.block_k},{c.split_k},{c.num_warps},{c.num_stages}"),
    ("fp8", "gemv_rows"): ("OCTAVO_FP8_GEMV_ROWS_TILES", lambda c: f"{c.block_n},{c.split},{c.num_warps}"),
    ("gguf_Q6_K", "gemv_pairs"): ("OCTAVO_GGUF_Q6K_PAIRS_TILES",
                                  lambda c: f"{c.block_n},{c.split},{c.num_warps},{c.stages}"),
    ("gguf_Q4_K", "gemv_dp4a"): ("OCTAVO_GGUF_Q4K_DP4A_TILES", lambda c: f"{c.block_n},{c.split},{c.num_warps}"),
    ("gguf_Q4_K", "gemv_pairs"): ("OCTAVO_GGUF_Q4K_PAIRS_TILES",
                                  lambda c: f"{c.block_n},{c.split},{c.num_warps},{c.stages}"),
    **{(f"gguf_{t}", "gemv"): (f"OCTAVO_GGUF_GEMV_TILES_{t}", lambda c: f"{c.block_n},{c.steps},{c.num_warps}")
       for t in ("Q4_K", "Q6_K")},
}


def select_plan(only: str | None, tokens: str | None) -> list:
    """PLAN cut to ``only`` (``family:path,...``) and to the token counts in ``tokens``."""
    wanted = {tuple(item.split(":", 1)) for item in only.split(",")} if only else None
    counts = {int(t) for t in tokens.split(",")} if tokens else None
    plan = []
    for family, name, token_counts, configs in PLAN:
        if wanted is not None and (family, name) not in wanted:
            continue
        kept = tuple(m for m in token_counts if counts is None or m in counts)
        if kept:
            plan.append((family, name, kept, configs))
    return plan


def write_env_file(best: dict, path: str) -> None:
    lines = []
    for (family, name, num_tokens), config in best.items():
        if num_tokens == 1 and config is not None and (family, name) in ENV_OVERRIDES:
            variable, render = ENV_OVERRIDES[(family, name)]
            lines.append(f"{variable}={render(config)}\n")
    Path(path).write_text("".join(lines))
    say("".join(lines).rstrip() or "no one-token configs to export")


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="family:path pairs, e.g. int4:gemv,fp8:gemv")
    parser.add_argument("--tokens", help="token counts to sweep, e.g. 1")
    parser.add_argument("--env-file", help="write the best one-token configs as KEY=VALUE lines")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        say("no CUDA device: this script is for the GPU machine")
        sys.exit(1)
    plan = select_plan(args.only, args.tokens)
    precompile(plan)
    best = run(plan)
    if args.env_file:
        write_env_file(best, args.env_file)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "quant_sweep.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))


if __name__ == "__main__":
    main()
