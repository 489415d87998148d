"""``octavo bench latency|throughput``: Octavo, optionally Hugging Face on the
same model and workload (``--compare-hf``), and the physical floor, in one table.

Token-id prompts (no tokenizer needed); ``--load-format dummy`` gives random
weights at a real model's shapes (configs in ``benchmarks/configs``).
"""

from __future__ import annotations

import argparse
import json


def add_parser(sub) -> None:
    from octavo.entrypoints.cli.common import add_engine_args

    parser = sub.add_parser("bench", help="benchmark latency or throughput")
    kinds = parser.add_subparsers(dest="bench_kind", required=True)
    latency = kinds.add_parser("latency", help="time to first token and decode time per token")
    add_engine_args(latency)
    latency.add_argument("--batch-size", type=int, default=1)
    latency.add_argument("--input-len", type=int, default=128)
    latency.add_argument("--output-len", type=int, default=128)
    latency.add_argument("--num-iters", type=int, default=5)
    latency.add_argument("--num-iters-warmup", type=int, default=2)
    throughput = kinds.add_parser("throughput", help="output tokens per second over many prompts")
    add_engine_args(throughput)
    throughput.add_argument("--num-prompts", type=int, default=512)
    throughput.add_argument("--input-len", type=int, default=256)
    throughput.add_argument("--output-len", type=int, default=256)
    for kind in (latency, throughput):
        kind.add_argument("--compare-hf", action="store_true", help="also run Hugging Face transformers")
        kind.add_argument("--hf-static-cache", action="store_true", help="HF latency with its static cache")
        kind.add_argument("--output-json", default=None, help="write the results here")
        kind.set_defaults(func=run)


def _table(rows: list[tuple[str, str, str, str, str]]) -> str:
    header = ("metric", "octavo", "hf", "speedup vs hf", "floor")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(5)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.2f} ms"


def _ratio(ours: float | None, theirs: float | None, lower_is_better: bool) -> str:
    if ours is None or theirs is None:
        return "n/a"
    return f"{theirs / ours:.2f}x" if lower_is_better else f"{ours / theirs:.2f}x"


def run(args: argparse.Namespace) -> int:

    from octavo.benchmarks import latency, throughput
    from octavo.benchmarks.floor import measure_ceilings
    from octavo.benchmarks.runs import OctavoRunner
    from octavo.benchmarks.step_trace import StepTrace
    from octavo.entrypoints.cli.common import engine_args_from
    from octavo.plugins.selection import select_platform
    from octavo.runtime.config import dtype_from_name

    platform = select_platform(args.platform).platform
    device = platform.device(0)
    ceilings = measure_ceilings(device)
    print(f"device {device}: copy {ceilings.copy_bytes_per_s / 1e12:.2f} TB/s, "
          f"matmul {ceilings.matmul_flops_per_s / 1e12:.0f} TFLOP/s (measured now)")
    engine_args = engine_args_from(args)
    if engine_args.max_model_len is None:
        engine_args.max_model_len = args.input_len + args.output_len
    if args.bench_kind == "latency":
        engine_args.max_num_seqs = max(engine_args.max_num_seqs, args.batch_size) if args.max_num_seqs != 256 else args.batch_size
    runner = OctavoRunner(engine_args)
    arch = _arch(runner)
    dtype = dtype_from_name(runner.engine.info.dtype)
    results = {"command": vars(args).copy(), "copy_tb_s": ceilings.copy_bytes_per_s / 1e12,
               "matmul_tflop_s": ceilings.matmul_flops_per_s / 1e12}
    results["command"].pop("func", None)
    trace = None
    if args.bench_kind == "latency":
        ours = latency.measure_octavo(runner, args.batch_size, args.input_len, args.output_len, args.num_iters, args.num_iters_warmup)
    else:
        # Data-parallel engines have no step observer: no trace there.
        trace = StepTrace() if hasattr(runner.engine, "step_observer") else None
        ours = throughput.measure_octavo(runner, args.num_prompts, args.input_len, args.output_len, trace)
    model_path, vocab_size = runner.engine.info.model_path, runner.vocab_size
    max_num_seqs = engine_args.max_num_seqs
    runner.close()
    theirs = _measure_hf(args, model_path, vocab_size, dtype, device) if args.compare_hf else None
    if args.bench_kind == "latency":
        floor = latency.floors(arch, dtype, ceilings, args.batch_size, args.input_len, args.output_len)
        rows = [
            (f"TTFT (batch {args.batch_size} x {args.input_len} tokens)", _ms(ours.ttft_s), _ms(theirs and theirs.ttft_s),
             _ratio(ours.ttft_s, theirs and theirs.ttft_s, True), _ms(floor.ttft_s)),
            (f"decode per token (batch {args.batch_size})", _ms(ours.decode_s_per_token), _ms(theirs and theirs.decode_s_per_token),
             _ratio(ours.decode_s_per_token, theirs and theirs.decode_s_per_token, True), _ms(floor.decode_s_per_token)),
        ]
        results.update(octavo=vars(ours), hf=theirs and vars(theirs), floor=vars(floor))
    else:
        floor = throughput.floor_tokens_per_s(arch, dtype, ceilings, args.num_prompts, args.input_len, args.output_len, max_num_seqs)
        fmt = lambda v: "n/a" if v is None else f"{v:,.0f} tok/s"  # noqa: E731
        rows = [(f"output tokens/s ({args.num_prompts} x {args.input_len} in / {args.output_len} out)",
                 fmt(ours), fmt(theirs), _ratio(ours, theirs, False), fmt(floor))]
        results.update(octavo_tok_s=ours, hf_tok_s=theirs, floor_tok_s=floor)
    print(_table(rows))
    if trace is not None:
        print(f"\nengine steps of the timed run (host time between step returns)\n{trace.format_table()}")
        results["step_trace"] = trace.to_json()
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(results, f, indent=2, default=str)
    return 0


def _measure_hf(args: argparse.Namespace, model_path, vocab_size: int, dtype, device):
    """The same workload through Hugging Face transformers (latency result or tokens/s)."""
    from octavo.benchmarks import latency, throughput
    from octavo.benchmarks.hf_baseline import free, load_hf_model

    model = load_hf_model(model_path, dtype, device, args.load_format == "dummy")
    try:
        if args.bench_kind == "latency":
            return latency.measure_hf(model, vocab_size, args.batch_size, args.input_len, args.output_len,
                                      max(2, args.num_iters // 2), device, args.hf_static_cache)
        return throughput.measure_hf(model, vocab_size, args.num_prompts, args.input_len, args.output_len, device)
    finally:
        free(model)


def _arch(runner):
    from pathlib import Path

    from octavo.models.config import load_arch_config

    return load_arch_config(Path(runner.engine.info.model_path))
