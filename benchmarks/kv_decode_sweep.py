"""Batch-1 decode and long-prompt prefill attention over a bf16 and an fp8
KV cache (issue 17):

    python benchmarks/kv_decode_sweep.py [--contexts 8192,32768] [--chunks 16384@16384] [--env-file FILE]

One request, Llama-3.1-8B attention shapes (``kernels_gpu.py``'s: 32 query
heads, 8 KV heads, head 128, blocks of 16 tokens), the split-KV decode
kernel the runtime takes for it, at each context and cache dtype:

- the default tiles (``default_decode_tiles``) and the best three of a
  sweep of (block_n, num_warps, num_stages), each with its time, the KV
  bandwidth it reaches (bytes of K and V read over the time, against the
  copy bandwidth) and its max difference from the default's output;
- the split count: the policy's, half and twice it, at the best tiles;
- fp8 against bf16 (best tiles each): the fp8 cache reads half the bytes,
  so a memory-bound kernel takes about half the time; x32 layers gives the
  attention part of a decode step.

Then a prefill chunk of Q new tokens over C cached ones (``--chunks Q@C``;
16384@16384 is the second chunk of ``quant_e2e.py kv``'s 32k prompt at
16384 batched tokens), the one-launch kernel as the runtime calls it: over
the fp8 cache with the chunk's own K/V fresh (``fresh_kv``), prefill tiles
swept (TFLOP/s beside the times). The context's fp8 tiles are widened in
registers: what is left of the fp8 prefill's cost.

With ``--env-file`` the best tiles (decode at the longest context, prefill
at the first chunk) are written as ``OCTAVO_TILES_SPLIT[_FP8]`` and
``OCTAVO_TILES_PREFILL[_FP8]`` lines for ``env $(cat FILE) python
benchmarks/quant_e2e.py kv`` (``gpu_round.sh kvfp8_tuned``).
Times: ``kernels_gpu.time_us`` (CUDA graph, L2 flushed, median); records go
to ``$OUT/kv_decode_sweep.jsonl``. Needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from octavo.kernels.paged_attention import AttentionParams, TileConfig, paged_attention, tiles_for  # noqa: E402
from octavo.kernels.split_kv_decode import SplitWorkspace, default_decode_tiles, split_kv_decode  # noqa: E402
from octavo.runtime.attention.triton_plan import SplitKvPolicy, num_compute_units  # noqa: E402

CACHE_DTYPES = {"bf16": None, "fp8": torch.float8_e4m3fn}  # None: the benchmark's own dtype
# fp8 tiles go to twice the keys of bf16's: the same bytes per tile.
SWEEPS = {
    "bf16": [TileConfig(16, n, w, s) for n in (32, 64, 128) for w in (4, 8) for s in (2, 3, 4)],
    "fp8": [TileConfig(16, n, w, s) for n in (64, 128, 256) for w in (4, 8) for s in (2, 3, 4)],
}
PREFILL_SWEEP = [TileConfig(m, n, w, 2) for m in (64, 128) for n in (64, 128) for w in (4, 8)]
NUM_LAYERS = 32
REPS = 30
PREFILL_REPS = 5


def tiles_name(tiles: TileConfig) -> str:
    return f"m{tiles.block_m} n{tiles.block_n} w{tiles.num_warps} s{tiles.num_stages}"


class DecodeCase:
    """One request of ``context`` tokens over a cache of ``kind`` ("bf16" or "fp8")."""

    def __init__(self, bench, context: int, kind: str) -> None:
        self.bench, self.kind, self.name = bench, kind, f"decode {context}"
        case = bench.AttnCase(f"b=1 ctx={context}", [context], [1])
        query, kv_cache, attn_batch = bench.build_batch(case, torch.Generator().manual_seed(0))
        dtype = CACHE_DTYPES[kind]
        self.query = query
        self.kv_cache = kv_cache if dtype is None else (kv_cache * 0.25).to(dtype)  # well inside e4m3's range
        self.paged = bench.AttnInputs(query, self.kv_cache, attn_batch).paged
        num_sms = num_compute_units(bench.DEVICE)
        self.splits = SplitKvPolicy().num_splits(1, bench.NUM_KV_HEADS, 1, context, num_sms)
        self.kv_bytes = context * bench.NUM_KV_HEADS * bench.HEAD_SIZE * 2 * self.kv_cache.element_size()
        self.default_tiles = default_decode_tiles(self.splits > 1, kind == "fp8")
        self.configs = SWEEPS[kind]

    def run(self, tiles: TileConfig, num_splits: int):
        """(us, output) of the decode kernel with ``tiles`` and ``num_splits``."""
        bench = self.bench
        workspace = None
        if num_splits > 1:
            workspace = SplitWorkspace.allocate(1, bench.NUM_HEADS, bench.HEAD_SIZE, num_splits, bench.DEVICE)
        params = AttentionParams(bench.SCALE)
        call = lambda: split_kv_decode(self.query, self.kv_cache, self.paged, params, workspace, tiles)  # noqa: E731
        return bench.time_us(call, reps=REPS), call()

    def describe(self, us: float, copy_bw: float) -> str:
        bw = self.kv_bytes / (us * 1e-6)
        return (f"{us:8.1f} us  {bw / 1e12:5.2f} TB/s {100 * bw / copy_bw:5.1f}% of copy  "
                f"x{NUM_LAYERS} {us * NUM_LAYERS / 1e3:6.3f} ms")


class ChunkCase:
    """One request's prefill chunk of ``query_len`` tokens after ``context`` cached ones."""

    def __init__(self, bench, query_len: int, context: int, kind: str) -> None:
        self.bench, self.kind, self.name = bench, kind, f"chunk {query_len}@{context}"
        case = bench.AttnCase(self.name, [context + query_len], [query_len])
        generator = torch.Generator().manual_seed(0)
        self.query, kv_cache, attn_batch = bench.build_batch(case, generator)
        dtype = CACHE_DTYPES[kind]
        self.kv_cache = kv_cache if dtype is None else (kv_cache * 0.25).to(dtype)
        self.paged = bench.AttnInputs(self.query, self.kv_cache, attn_batch).paged
        shape = (query_len, bench.NUM_KV_HEADS, bench.HEAD_SIZE)
        # The runtime's fresh path: the chunk's own K/V beside the cache (fp8 only).
        self.fresh = None if dtype is None else tuple(
            torch.randn(shape, generator=generator).to(bench.DEVICE, bench.DTYPE) for _ in range(2))
        self.flops = case.flops
        self.splits = 1  # the one-launch kernel does not split
        self.default_tiles = tiles_for(query_len, bench.HEAD_SIZE)
        self.configs = PREFILL_SWEEP

    def run(self, tiles: TileConfig, num_splits: int = 1):
        params = AttentionParams(self.bench.SCALE)
        cache, paged, fresh = self.kv_cache, self.paged, self.fresh
        call = lambda: paged_attention(self.query, cache, paged, params, tiles, fresh_kv=fresh)  # noqa: E731
        return self.bench.time_us(call, reps=PREFILL_REPS), call()

    def describe(self, us: float, copy_bw: float) -> str:
        tflops = self.flops / (us * 1e-6) / 1e12
        return f"{us:8.1f} us  {tflops:6.1f} TFLOP/s  x{NUM_LAYERS} {us * NUM_LAYERS / 1e3:7.2f} ms"


def sweep_case(case, copy_bw: float, records: list) -> tuple[float, TileConfig]:
    """Time the default tiles, the sweep and (decode) the split counts; return the best (us, tiles)."""
    say, splits, default = case.bench.say, case.splits, case.default_tiles
    tag = {"case": case.name, "kv": case.kind}
    default_us, default_out = case.run(default, splits)
    timings = [(default_us, default, 0.0)]
    for tiles in case.configs:
        if tiles == default:
            continue
        try:
            us, out = case.run(tiles, splits)
        except Exception as exc:  # a shape that does not fit (shared memory, registers)
            records.append({**tag, "tiles": asdict(tiles), "failed": str(exc)[:200]})
            continue
        timings.append((us, tiles, case.bench.max_error(out, default_out)))
    for us, tiles, error in timings:
        records.append({**tag, "tiles": asdict(tiles), "splits": splits, "us": us, "error_vs_default": error})
    say(f"{case.kind:4s} {case.name:18s} default {tiles_name(default):16s} {splits:3d} splits "
        f"{case.describe(default_us, copy_bw)}")
    ranked = sorted(timings, key=lambda t: t[0])
    for rank, (us, tiles, error) in enumerate(ranked[:3], 1):
        say(f"{'':23s} best {rank}  {tiles_name(tiles):16s} {splits:3d} splits {case.describe(us, copy_bw)}  "
            f"x{default_us / us:4.2f}  err {error:.4f}")
    best_us, best_tiles, _ = ranked[0]
    if splits == 1:
        return best_us, best_tiles
    for other in (splits // 2, splits * 2):
        us, _ = case.run(best_tiles, other)
        records.append({**tag, "tiles": asdict(best_tiles), "splits": other, "us": us})
        say(f"{'':23s} splits {other:3d} {tiles_name(best_tiles):16s}      {case.describe(us, copy_bw)}")
    return best_us, best_tiles


def run(bench, contexts: list[int], env_file: str | None, chunks: list[tuple[int, int]] = ()) -> list[dict]:
    copy_bw = bench.copy_bandwidth()
    bench.say(f"batch-1 split-KV decode, one layer; copy bandwidth {copy_bw / 1e12:.2f} TB/s")
    records: list[dict] = []
    best: dict[tuple[str, str], tuple[float, TileConfig]] = {}
    cases = [(f"decode {c}", lambda kind, c=c: DecodeCase(bench, c, kind)) for c in contexts]
    cases += [(f"chunk {q}@{c}", lambda kind, q=q, c=c: ChunkCase(bench, q, c, kind)) for q, c in chunks]
    for label, make in cases:
        for kind in CACHE_DTYPES:
            best[label, kind] = sweep_case(make(kind), copy_bw, records)
            if bench.DEVICE.type == "cuda":
                torch.cuda.empty_cache()
        ratio = best[label, "fp8"][0] / best[label, "bf16"][0]
        bench.say(f"{label}: fp8 / bf16 (best tiles each) {ratio:.2f}x the time")
        records.append({"case": label, "fp8_over_bf16": ratio})
    if env_file:
        chosen = {"SPLIT": f"decode {max(contexts)}"}
        if chunks:
            chosen["PREFILL"] = f"chunk {chunks[0][0]}@{chunks[0][1]}"
        lines = [f"OCTAVO_TILES_{name}{'_FP8' if kind == 'fp8' else ''}={t.block_m},{t.block_n},{t.num_warps},"
                 f"{t.num_stages}" for name, label in chosen.items() for kind in CACHE_DTYPES
                 for t in [best[label, kind][1]]]
        Path(env_file).write_text("\n".join(lines) + "\n")
        bench.say(f"wrote {env_file}: {' '.join(lines)}")
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="8192,32768")
    parser.add_argument("--chunks", default="16384@16384", help="prefill chunks, new@cached tokens ('' for none)")
    parser.add_argument("--env-file", default=None)
    args = parser.parse_args(argv)
    chunks = [tuple(int(n) for n in chunk.split("@")) for chunk in args.chunks.split(",") if chunk]
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA (or ROCm) device")
    import kernels_gpu as bench  # benchmarks/ is on the path when run as a script

    records = run(bench, [int(c) for c in args.contexts.split(",")], args.env_file, chunks)
    out_dir = os.environ.get("OUT")
    if out_dir:
        with open(Path(out_dir) / "kv_decode_sweep.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
