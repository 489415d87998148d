#!/usr/bin/env python
"""End-to-end speed of each quantization method beside bf16 and the floor,
all measured in one run (issue 17's figures), Llama-3.1-8B shapes, dummy
weights, token-id prompts:

    python benchmarks/quant_e2e.py latency    [--methods bf16,fp8,int4] [--gguf FILE]
    python benchmarks/quant_e2e.py throughput [--methods bf16,fp8,int4]
    python benchmarks/quant_e2e.py kv         [--context 32768]

* ``latency``: batch 1, 128 tokens in and 128 out: TTFT and decode ms/token.
* ``throughput``: 512 prompts x (256 in, 256 out): output tokens/s.
* ``kv``: bf16 against fp8 KV cache (same weights, same memory budget):
  batch-1 decode ms/token at ``--context`` tokens, and how many 4096-token
  sequences the ``--gpu-memory-utilization`` budget holds at each KV dtype
  (the planner's figure, ``KVCachePlan.sequences_fit``; the engine itself
  allocates only what its one ``--context`` sequence can use).

Each method's engine is built, timed and closed in turn in this process
(the copy bandwidth and matmul rate are measured once, first). The floor of
a method is ``octavo bench``'s, from the method's own weight inventory
(``octavo.benchmarks.inventory``: the weights as loaded, scales and zero
points included, measured on the meta device) and KV dtype: the bytes a
step reads over the copy bandwidth, or its matmuls over the matmul rate of
their kind, whichever is longer ("read GiB": what every decode step reads
whole). ``--gguf FILE`` adds a GGUF file (``benchmarks/make_gguf_8b.py``
writes one). With ``--output-json`` the figures are written there too.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from octavo.benchmarks import latency, throughput  # noqa: E402
from octavo.benchmarks.ceilings import measure_ceilings  # noqa: E402
from octavo.benchmarks.inventory import WeightInventory, measure_inventory  # noqa: E402
from octavo.benchmarks.runs import OctavoRunner  # noqa: E402
from octavo.engine_args import EngineArgs  # noqa: E402

CONFIG_8B = Path(__file__).resolve().parent / "configs" / "llama-3.1-8b"
SEQUENCE_TOKENS = 4096  # the "sequences that fit" figure counts sequences of this length


@dataclasses.dataclass(frozen=True)
class Method:
    name: str
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    gguf: str | None = None  # a .gguf file instead of the config directory


def methods_for(args: argparse.Namespace) -> list[Method]:
    if args.mode == "kv":
        return [Method("bf16 KV"), Method("fp8 KV", kv_cache_dtype="fp8")]
    known = {"bf16": Method("bf16"), "fp8": Method("fp8", "fp8"), "int4": Method("int4", "int4"),
             "int8": Method("int8", "int8")}
    chosen = [known[name] for name in args.methods.split(",") if name]  # "" with --gguf: the file alone
    if args.gguf:
        chosen.append(Method(f"gguf {Path(args.gguf).stem}", gguf=args.gguf))
    return chosen


def engine_args(args: argparse.Namespace, method: Method, input_len: int, output_len: int) -> EngineArgs:
    return EngineArgs(
        model=method.gguf or args.model, load_format="gguf" if method.gguf else args.load_format, dtype=args.dtype,
        quantization=method.quantization, kv_cache_dtype=method.kv_cache_dtype, max_model_len=input_len + output_len,
        max_num_seqs=1 if args.mode != "throughput" else args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, gpu_memory_utilization=args.gpu_memory_utilization,
        platform=args.platform,
    )


def inventory_of(args: argparse.Namespace, method: Method, platform, device) -> WeightInventory:
    """What the method's steps read, as loaded (``octavo bench``'s floors count the same)."""
    dtype = getattr(torch, args.dtype)
    kv_dtype = dtype if method.kv_cache_dtype == "auto" else platform.kv_cache_dtype(method.kv_cache_dtype)
    return measure_inventory(method.gguf or args.model, method.quantization, dtype, kv_dtype, device)


def measure(args: argparse.Namespace, method: Method, inventory: WeightInventory, ceilings) -> dict:
    input_len, output_len = (args.context - args.output_len, args.output_len) if args.mode == "kv" else (
        args.input_len, args.output_len)
    runner = OctavoRunner(engine_args(args, method, input_len, output_len))
    try:
        row = {"method": method.name, "weight_gib": inventory.dense_bytes / 2**30}
        if args.mode == "throughput":
            row["tok_s"] = throughput.measure_octavo(runner, args.num_prompts, input_len, output_len)
            row["floor_tok_s"] = throughput.floor_tokens_per_s(
                inventory, ceilings, args.num_prompts, input_len, output_len, args.max_num_seqs)
            return row
        workload = latency.LatencyWorkload(1, input_len, output_len)
        ours = latency.measure_octavo(runner, workload, args.num_iters, 1)
        floor = latency.floors(inventory, ceilings, workload)
        row.update(ttft_ms=ours.ttft_s * 1e3, decode_ms=ours.decode_s_per_token * 1e3,
                   floor_decode_ms=floor.decode_s_per_token * 1e3)
        if args.mode == "kv":
            row.update(kv_capacity(runner))
        return row
    finally:
        runner.close()


def kv_capacity(runner: OctavoRunner) -> dict:
    """How many ``SEQUENCE_TOKENS``-token sequences the KV budget holds, from
    the planner's budget: the allocation itself is capped at what
    ``max_num_seqs`` (1 here) sequences of ``--context`` tokens use, the same
    for both dtypes. The engine's worker runs in this process (one device)."""
    plan = runner.engine.executor.worker.runner.kv_plan
    return {"seqs_4k": plan.sequences_fit(SEQUENCE_TOKENS), "kv_budget_gib": plan.budget_bytes / 2**30,
            "kv_budget_tokens": plan.budget_tokens}


def format_table(mode: str, rows: list[dict]) -> str:
    """One row per method; ``vs`` is the speed against the first row (above 1: faster)."""
    base = rows[0]
    if mode == "throughput":
        lines = [f"{'method':<16}{'read GiB':>12}{'tok/s':>10}{'floor tok/s':>13}{'vs ' + base['method']:>10}"]
        lines += [f"{r['method']:<16}{r['weight_gib']:>12.2f}{r['tok_s']:>10,.0f}{r['floor_tok_s']:>13,.0f}"
                  f"{r['tok_s'] / base['tok_s']:>9.2f}x" for r in rows]
        return "\n".join(lines)
    extra = f"{'4k seqs':>9}" if mode == "kv" else ""
    lines = [f"{'method':<16}{'read GiB':>12}{'TTFT ms':>9}{'decode ms/tok':>15}{'floor ms/tok':>14}"
             f"{'vs ' + base['method']:>10}{extra}"]
    for r in rows:
        line = (f"{r['method']:<16}{r['weight_gib']:>12.2f}{r['ttft_ms']:>9.1f}{r['decode_ms']:>15.3f}"
                f"{r['floor_decode_ms']:>14.3f}{base['decode_ms'] / r['decode_ms']:>9.2f}x")
        lines.append(line + (f"{r['seqs_4k']:>9}" if mode == "kv" else ""))
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("latency", "throughput", "kv"))
    parser.add_argument("--model", default=str(CONFIG_8B))
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--platform", default=None)
    parser.add_argument("--methods", default="bf16,fp8,int4", help="comma-separated: bf16, fp8, int4, int8")
    parser.add_argument("--gguf", default=None, help="also time this .gguf file")
    parser.add_argument("--input-len", type=int, default=None, help="128 (latency), 256 (throughput)")
    parser.add_argument("--output-len", type=int, default=None, help="128 (latency), 256 (throughput), 64 (kv)")
    parser.add_argument("--context", type=int, default=32768, help="kv mode: prompt + output tokens")
    parser.add_argument("--num-iters", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=512)
    parser.add_argument("--max-num-seqs", type=int, default=512)
    parser.add_argument("--max-num-batched-tokens", type=int, default=16384)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--output-json", default=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    defaults = {"latency": (128, 128), "throughput": (256, 256), "kv": (None, 64)}[args.mode]
    args.input_len = args.input_len or defaults[0]
    args.output_len = args.output_len or defaults[1]
    from octavo.plugins.selection import select_platform

    platform = select_platform(args.platform).platform
    device = platform.device(0)
    methods = methods_for(args)
    inventories = [inventory_of(args, method, platform, device) for method in methods]
    kinds = list(dict.fromkeys(kind for inventory in inventories for kind in inventory.matmul_kinds()))
    ceilings = measure_ceilings(device, kinds)
    print(f"device {device}: {ceilings.describe()} (measured now)", flush=True)
    rows = []
    for method, inventory in zip(methods, inventories):
        rows.append(measure(args, method, inventory, ceilings))
        print(f"{method.name}: {json.dumps(rows[-1])}", flush=True)
    print("\n" + format_table(args.mode, rows))
    if args.output_json:
        Path(args.output_json).write_text(json.dumps({"mode": args.mode, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
