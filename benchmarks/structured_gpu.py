"""Structured outputs' cost: json_schema decoding next to unconstrained
decoding, in one run, on random weights at a real model's shapes.

    python benchmarks/structured_gpu.py [--config benchmarks/configs/llama-3.1-8b.json]
        [--tokenizer DIR] [--batch-size 64] [--input-len 128] [--output-len 256]

Both runs decode ``batch-size`` greedy sequences of ``output-len`` tokens
from the same random prompts; the constrained one under a JSON schema whose
shortest valid output is longer than ``output-len`` (an array of at least
1000 records with integer, string, enum and number fields), so every
sequence stays in the batch to the end, as in the unconstrained run. The
schema is compiled before the clock starts (a server caches it the same way).
Printed: output tokens/s and mean decode-step time of each run, the overhead
of the constrained run, and the decode-step floor (weights plus KV cache over
the measured copy bandwidth). Target on the H200 at batch 64: <= 10 %.

The tokenizer (xgrammar needs a real vocabulary) defaults to the Llama 2
one in ``shared/tokenizers/llama2`` (in the checkout, or beside it); the
model's own vocabulary size (128,256 for Llama-3.1-8B) is what the masks
cover, tokens past the tokenizer's being never allowed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCHEMA = {
    "type": "object",
    "properties": {
        "records": {
            "type": "array",
            "minItems": 1000,
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 0, "maximum": 1000000},
                    "name": {"type": "string", "maxLength": 24},
                    "color": {"enum": ["red", "green", "blue"]},
                    "score": {"type": "number"},
                },
                "required": ["id", "name", "color", "score"],
            },
        }
    },
    "required": ["records"],
}


def default_tokenizer() -> Path | None:
    for parent in (ROOT, *ROOT.parents[:2]):
        candidate = parent / "shared" / "tokenizers" / "llama2"
        if (candidate / "tokenizer.json").exists():
            return candidate
    return None


def model_dir(config: Path, tokenizer: Path, out: Path) -> Path:
    for file in tokenizer.iterdir():
        if file.is_file():
            shutil.copy(file, out / file.name)
    shutil.copy(config, out / "config.json")
    return out


def run(engine, prompts, params, trace) -> tuple[float, int]:
    """Seconds for every prompt to finish, and the output tokens generated."""
    engine.step_observer = trace.observe
    started = time.perf_counter()
    for index, prompt in enumerate(prompts):
        engine.add_request(f"bench-{index}-{started}", {"prompt_token_ids": prompt}, params)
    last = time.perf_counter()
    trace.setup_seconds = last - started
    num_tokens = 0
    while engine.has_unfinished_requests():
        for output in engine.step():
            num_tokens += sum(len(c.token_ids) for c in output.outputs) if output.finished else 0
        now = time.perf_counter()
        trace.end_step(now - last)
        last = now
    engine.step_observer = None
    return time.perf_counter() - started, num_tokens


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=ROOT / "benchmarks" / "configs" / "llama-3.1-8b.json")
    parser.add_argument("--tokenizer", type=Path, default=None)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    tokenizer = args.tokenizer or default_tokenizer()
    if tokenizer is None:
        parser.error("no tokenizer: pass --tokenizer DIR (the shared Llama 2 tokenizer was not found)")

    import torch

    from octavo.benchmarks.ceilings import measure_ceilings
    from octavo.benchmarks.floor import decode_step_floor
    from octavo.benchmarks.inventory import measure_inventory
    from octavo.benchmarks.runs import random_prompts
    from octavo.benchmarks.step_trace import DECODE, StepTrace
    from octavo.core.sampling_params import RequestOutputKind, SamplingParams
    from octavo.core.structured_output.params import StructuredOutputsParams
    from octavo.engine_args import EngineArgs, build_engine
    from octavo.models.config import load_arch_config
    from octavo.runtime.config import dtype_from_name

    with tempfile.TemporaryDirectory() as scratch:
        path = model_dir(args.config, tokenizer, Path(scratch))
        arch = load_arch_config(path)
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        dtype = dtype_from_name(args.dtype)
        inventory = measure_inventory(str(path), None, dtype, dtype, device)
        engine = build_engine(EngineArgs(
            model=str(path), load_format="dummy", dtype=args.dtype, max_num_seqs=args.batch_size,
            max_model_len=args.input_len + args.output_len + 16,
        ))
        common = dict(temperature=0.0, max_tokens=args.output_len, detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY)
        modes = {
            "unconstrained": SamplingParams(ignore_eos=True, **common),
            "json_schema": SamplingParams(structured_outputs=StructuredOutputsParams(json=SCHEMA), **common),
        }
        vocab = engine.limits.vocab_size
        results = {}
        try:
            for name, params in modes.items():
                engine.check_structured_outputs(params)  # compile outside the clock
                run(engine, random_prompts(min(8, args.batch_size), args.input_len, vocab, seed=99),
                    SamplingParams(**{**params.__dict__, "max_tokens": 4}), StepTrace())  # warm up
            prompts = random_prompts(args.batch_size, args.input_len, vocab)
            for name, params in modes.items():
                trace = StepTrace()
                seconds, num_tokens = run(engine, prompts, params, trace)
                results[name] = {
                    "seconds": seconds, "output_tokens": num_tokens, "tokens_per_s": num_tokens / seconds,
                    "decode_step_ms": trace.summary()[DECODE]["mean_ms"],
                }
        finally:
            engine.shutdown()
    ceilings = measure_ceilings(device, inventory.matmul_kinds())
    context = args.input_len + args.output_len / 2
    floor_ms = 1e3 * decode_step_floor(inventory, ceilings, args.batch_size, context).seconds
    base, constrained = results["unconstrained"], results["json_schema"]
    overhead = base["tokens_per_s"] / constrained["tokens_per_s"] - 1
    print(f"batch {args.batch_size}, {args.input_len} in / {args.output_len} out, {arch.architecture}, {args.dtype}, {device.type}")
    print(f"{'mode':14s} {'output tok/s':>13} {'decode step ms':>15} {'tokens':>8}")
    for name, row in results.items():
        print(f"{name:14s} {row['tokens_per_s']:13.1f} {row['decode_step_ms']:15.2f} {row['output_tokens']:8d}")
    print(f"{'floor':14s} {1e3 * args.batch_size / floor_ms:13.1f} {floor_ms:15.2f}")
    print(f"json_schema overhead: {100 * overhead:.1f}% of unconstrained throughput (target <= 10%)")
    summary = {"args": {k: str(v) for k, v in vars(args).items()}, "results": results, "floor_step_ms": floor_ms, "overhead": overhead}
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
