"""Where a step's time goes: host phases (timed with device syncs) and the
top device kernels (torch.profiler), for a prefill and for decode steps.

    python benchmarks/profile_step.py --model benchmarks/configs/llama-3.1-8b --load-format dummy \
        --dtype bfloat16 --batch-size 1 --input-len 512 --decode-steps 32 [--enforce-eager]

A diagnostic, not a benchmark: the syncs it adds cost time themselves.
"""

from __future__ import annotations

import argparse
import collections
import time

import torch

from octavo.benchmarks.runs import random_prompts
from octavo.core.sampling_params import RequestOutputKind, SamplingParams
from octavo.engine_args import EngineArgs, build_engine

TIMES: dict[str, list[float]] = collections.defaultdict(list)
PHASE = ["prefill"]


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(name, fn):
    def wrapper(*args, **kwargs):
        sync()
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        sync()
        TIMES[f"{PHASE[0]:<8} {name}"].append(time.perf_counter() - start)
        return result

    return wrapper


def instrument(engine) -> None:
    runner = engine.executor.worker.runner
    engine.scheduler.schedule = timed("schedule", engine.scheduler.schedule)
    engine.scheduler.update_from_output = timed("update", engine.scheduler.update_from_output)
    engine.output_processor.process = timed("outputs", engine.output_processor.process)
    engine.executor.execute_model = timed("execute (all)", engine.executor.execute_model)
    runner.inputs.prepare = timed("  prepare inputs", runner.inputs.prepare)
    runner.run_model = timed("  model forward (eager)", runner.run_model)
    runner.sampler.sample = timed("  sample", runner.sampler.sample)
    if runner.graphs is not None:
        runner.graphs.replay = timed("  graph replay", runner.graphs.replay)
    if runner.prefill_graphs is not None:
        runner.prefill_graphs.replay = timed("  prefill graph replay", runner.prefill_graphs.replay)


def report(title: str) -> None:
    print(f"--- {title}")
    for name, values in TIMES.items():
        print(f"{name:<36} {1e3 * sum(values) / len(values):8.3f} ms x {len(values)}")
    TIMES.clear()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--decode-steps", type=int, default=32)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--kernels", action="store_true", help="also print the top device kernels")
    args = parser.parse_args()
    engine = build_engine(EngineArgs(
        model=args.model, load_format=args.load_format, dtype=args.dtype, skip_tokenizer_init=True,
        max_model_len=args.input_len + args.decode_steps + 8, max_num_seqs=max(args.batch_size, 1),
        max_num_batched_tokens=max(8192, args.batch_size * args.input_len), enforce_eager=args.enforce_eager,
    ))
    params = SamplingParams(temperature=0, max_tokens=args.decode_steps + 1, ignore_eos=True, detokenize=False,
                            output_kind=RequestOutputKind.FINAL_ONLY)
    vocab = engine.limits.vocab_size

    def run(seed: int, profile_kernels: bool = False):
        for i, prompt in enumerate(random_prompts(args.batch_size, args.input_len, vocab, seed)):
            engine.add_request(f"{seed}-{i}", {"prompt_token_ids": prompt}, params)
        steps = 0
        step_times = []
        while engine.has_unfinished_requests():
            PHASE[0] = "prefill" if steps == 0 else "decode"
            t = time.perf_counter()
            if profile_kernels and steps in (0, 3):
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA, torch.profiler.ProfilerActivity.CPU]) as prof:
                    engine.step()
                    torch.cuda.synchronize()
                label = "prefill" if steps == 0 else "decode"
                print(f"--- top kernels, {label} step")
                print(prof.key_averages().table(sort_by="device_time_total", row_limit=14, max_name_column_width=60))
            else:
                engine.step()
            step_times.append(time.perf_counter() - t)
            steps += 1
        return step_times

    run(1)  # warm up
    plain = run(2)
    print(f"unsynchronised: first step {plain[0] * 1e3:.2f} ms, decode steps mean {1e3 * sum(plain[1:]) / len(plain[1:]):.3f} ms")
    instrument(engine)
    run(3)
    report(f"batch {args.batch_size}, prompt {args.input_len}, {args.decode_steps} decode steps (synchronised timings)")
    if args.kernels:
        run(4, profile_kernels=True)


if __name__ == "__main__":
    main()
