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
    from octavo.benchmarks import serve_bench

    serve_bench.add_parser(kinds)  # octavo bench serve: a load client for any OpenAI-compatible server
    throughput = kinds.add_parser("throughput", help="output tokens per second over many prompts")
    add_engine_args(throughput)
    throughput.add_argument("--num-prompts", type=int, default=512)
    throughput.add_argument("--input-len", type=int, default=256)
    throughput.add_argument("--output-len", type=int, default=256)
    for kind in (latency, throughput):
        kind.add_argument("--compare-hf", action="store_true", help="also run Hugging Face transformers")
        kind.add_argument(
            "--hf-mode", default=None, choices=("compiled", "static", "eager", "generate_batch"),
            help="how HF runs: latency compiled (default: static cache + torch.compile), static or eager; "
                 "throughput generate_batch (continuous batching, the default and only one)",
        )
        kind.add_argument("--output-json", default=None, help="write the results here")
        kind.set_defaults(func=run)


def hf_mode(args: argparse.Namespace) -> str:
    """The HF mode this run compares with (refused before anything loads if it does not fit the benchmark)."""
    from octavo.benchmarks.hf_baseline import LATENCY_MODES, THROUGHPUT_MODES
    from octavo.errors import InvalidArgumentError

    modes = LATENCY_MODES if args.bench_kind == "latency" else THROUGHPUT_MODES
    mode = args.hf_mode or modes[0]
    if mode not in modes:
        raise InvalidArgumentError(
            f"--hf-mode {mode} does not apply to bench {args.bench_kind} (choose from {', '.join(modes)})", param="hf_mode"
        )
    return mode


def _table(rows: list[tuple[str, str, str, str, str]], hf_column: str) -> str:
    header = ("metric", "octavo", hf_column, "speedup vs hf", "floor")
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
    from octavo.benchmarks.runs import OctavoRunner
    from octavo.entrypoints.cli.common import engine_args_from
    from octavo.plugins.selection import select_platform

    mode = hf_mode(args) if args.compare_hf else None
    platform = select_platform(args.platform).platform
    engine_args = engine_args_from(args)
    if engine_args.max_model_len is None:
        engine_args.max_model_len = args.input_len + args.output_len
    if args.bench_kind == "latency":
        engine_args.max_num_seqs = max(engine_args.max_num_seqs, args.batch_size) if args.max_num_seqs != 256 else args.batch_size
    runner = OctavoRunner(engine_args)
    ours, trace = _measure_octavo(args, runner)
    model_path, vocab_size = runner.engine.info.model_path, runner.vocab_size
    dtype_name = runner.engine.info.dtype
    spec_decoding = runner.engine.get_stats().spec_decoding
    runner.close()
    # After Octavo's run, before HF's: the ceilings and what the floors count.
    device = platform.device(0)
    inventory, ceilings = _inventory_and_ceilings(args, platform, model_path, dtype_name, device)
    print(f"device {device}: {ceilings.describe()} (measured now)")
    theirs = _measure_hf(args, mode, model_path, vocab_size, inventory, device) if mode else None
    results = {"command": {k: v for k, v in vars(args).items() if k != "func"}, "hf_mode": mode,
               "copy_tb_s": ceilings.copy_bytes_per_s / 1e12,
               "matmul_tflop_s": {kind: rate / 1e12 for kind, rate in ceilings.matmul_flops_per_s.items()}}
    rows = _rows(args, ours, theirs, inventory, ceilings, engine_args.max_num_seqs, results)
    print(_table(rows, _hf_column(mode)))
    from octavo.benchmarks.floor import describe

    print(describe(inventory, ceilings))
    if spec_decoding is not None:
        results["spec_decoding"] = vars(spec_decoding)
        print(_describe_spec_decoding(spec_decoding))
    if trace is not None:
        print(f"\nengine steps of the timed run (host time between step returns)\n{trace.format_table()}")
        results["step_trace"] = trace.to_json()
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(results, f, indent=2, default=str)
    return 0


def _describe_spec_decoding(stats) -> str:
    """What speculation did over the whole run (warm-up included), and why the floor does not bound it."""
    acceptance = stats.num_accepted_tokens / stats.num_draft_tokens if stats.num_draft_tokens else 0.0
    return (
        f"speculative decoding: {stats.num_drafts} drafting request-steps, {stats.num_accepted_tokens} of "
        f"{stats.num_draft_tokens} draft tokens accepted ({acceptance:.2f}; by position {stats.accepted_per_position}); "
        "the floor counts one token a step per sequence, so speculation may pass it"
    )


def _hf_column(mode: str | None) -> str:
    from octavo.benchmarks.hf_baseline import MODE_NAMES

    return "hf" if mode is None else f"hf ({mode}: {MODE_NAMES[mode]})"


def _measure_octavo(args: argparse.Namespace, runner):
    from octavo.benchmarks import latency, throughput
    from octavo.benchmarks.step_trace import StepTrace

    if args.bench_kind == "latency":
        workload = latency.LatencyWorkload(args.batch_size, args.input_len, args.output_len)
        return latency.measure_octavo(runner, workload, args.num_iters, args.num_iters_warmup), None
    # Data-parallel engines have no step observer: no trace there.
    trace = StepTrace() if hasattr(runner.engine, "step_observer") else None
    return throughput.measure_octavo(runner, args.num_prompts, args.input_len, args.output_len, trace), trace


def _inventory_and_ceilings(args, platform, model_path: str, dtype_name: str, device):
    from octavo.benchmarks.ceilings import measure_ceilings
    from octavo.benchmarks.inventory import measure_inventory
    from octavo.runtime.config import dtype_from_name

    dtype = dtype_from_name(dtype_name)
    kv_dtype = dtype if args.kv_cache_dtype == "auto" else platform.kv_cache_dtype(args.kv_cache_dtype)
    inventory = measure_inventory(model_path, args.quantization, dtype, kv_dtype, device)
    return inventory, measure_ceilings(device, inventory.matmul_kinds())


def _rows(args, ours, theirs, inventory, ceilings, max_num_seqs: int, results: dict) -> list[tuple[str, ...]]:
    from octavo.benchmarks import latency, throughput

    if args.bench_kind == "latency":
        workload = latency.LatencyWorkload(args.batch_size, args.input_len, args.output_len)
        floor = latency.floors(inventory, ceilings, workload)
        results.update(octavo=vars(ours), hf=theirs and vars(theirs), floor=vars(floor))
        return [
            (f"TTFT (batch {args.batch_size} x {args.input_len} tokens)", _ms(ours.ttft_s), _ms(theirs and theirs.ttft_s),
             _ratio(ours.ttft_s, theirs and theirs.ttft_s, True), _ms(floor.ttft_s)),
            (f"decode per token (batch {args.batch_size})", _ms(ours.decode_s_per_token), _ms(theirs and theirs.decode_s_per_token),
             _ratio(ours.decode_s_per_token, theirs and theirs.decode_s_per_token, True), _ms(floor.decode_s_per_token)),
        ]
    floor = throughput.floor_tokens_per_s(inventory, ceilings, args.num_prompts, args.input_len, args.output_len, max_num_seqs)
    results.update(octavo_tok_s=ours, hf_tok_s=theirs, floor_tok_s=floor)
    fmt = lambda v: "n/a" if v is None else f"{v:,.0f} tok/s"  # noqa: E731
    return [(f"output tokens/s ({args.num_prompts} x {args.input_len} in / {args.output_len} out)",
             fmt(ours), fmt(theirs), _ratio(ours, theirs, False), fmt(floor))]


def _measure_hf(args: argparse.Namespace, mode: str, model_path, vocab_size: int, inventory, device):
    """The same workload through Hugging Face transformers (latency result or tokens/s)."""
    from octavo.benchmarks import latency, throughput
    from octavo.benchmarks.hf_baseline import free, load_hf_model
    from octavo.runtime.config import dtype_from_name

    model = load_hf_model(model_path, dtype_from_name(inventory.model_kind), device, args.load_format == "dummy")
    try:
        if args.bench_kind == "latency":
            workload = latency.LatencyWorkload(args.batch_size, args.input_len, args.output_len)
            return latency.measure_hf(model, vocab_size, workload, max(2, args.num_iters // 2), device, mode)
        return throughput.measure_hf(model, vocab_size, args.num_prompts, args.input_len, args.output_len, device)
    finally:
        free(model)
