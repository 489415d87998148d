"""Where a step's time goes: host phases (timed with device syncs) and the
top device kernels (torch.profiler), for a prefill and for decode steps.

    python benchmarks/profile_step.py --model benchmarks/configs/llama-3.1-8b --load-format dummy \
        --dtype bfloat16 --batch-size 1 --input-len 512 --decode-steps 32 [--enforce-eager]

A diagnostic, not a benchmark: the syncs it adds cost time themselves.
"""

from __future__ import annotations

import argparse
import collections
import gc
import statistics
import time
from collections.abc import Callable

import torch

from octavo.benchmarks.runs import random_prompts
from octavo.core.engine_core import EngineCore
from octavo.core.gc_heap import freeze_startup_heap
from octavo.core.sampling_params import RequestOutputKind, SamplingParams
from octavo.distributed.output_codec import pack_outputs
from octavo.distributed.serialization import encode
from octavo.engine_args import EngineArgs, build_engine, build_single_engine

TIMES: dict[str, list[float]] = collections.defaultdict(list)
PHASE = ["prefill"]
# --clock thread: the calling thread's CPU time, which other processes on a
# shared machine do not inflate (host phases only: a forward's worker threads are not counted).
CLOCK = [time.perf_counter]
# --engine-process: builds the engine process's message to its front from a step's outputs.
MESSAGE: list[Callable[[list], bytes]] = [lambda outputs: b""]


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(name, fn):
    def wrapper(*args, **kwargs):
        sync()
        start = CLOCK[0]()
        result = fn(*args, **kwargs)
        sync()
        TIMES[f"{PHASE[0]:<8} {name}"].append(CLOCK[0]() - start)
        return result

    return wrapper


def instrument(engine) -> None:
    runner = engine.executor.worker.runner
    engine.scheduler.schedule = timed("schedule", engine.scheduler.schedule)
    engine.scheduler.update_from_output = timed("update", engine.scheduler.update_from_output)
    # The engine's whole output step (one call a step, whatever the processor's granularity).
    engine._process_outputs = timed("outputs", engine._process_outputs)
    engine.executor.execute_model = timed("execute (all)", engine.executor.execute_model)
    runner.inputs.prepare = timed("  prepare inputs", runner.inputs.prepare)
    runner.run_model = timed("  model forward (eager)", runner.run_model)
    runner.model.compute_logits = timed("  logits", runner.model.compute_logits)
    runner.sampler.sample = timed("  sample", runner.sampler.sample)
    if runner.graphs is not None:
        runner.graphs.replay = timed("  graph replay", runner.graphs.replay)
    if runner.prefill_graphs is not None:
        runner.prefill_graphs.replay = timed("  prefill graph replay", runner.prefill_graphs.replay)


# Cyclic-GC collections by generation and their total time: a collection
# lands in whichever phase allocates at the time and inflates it.
GC = {"start": 0.0, "total": 0.0, "counts": [0, 0, 0]}


def _count_gc(phase: str, info: dict) -> None:
    if phase == "start":
        GC["start"] = time.perf_counter()
    else:
        GC["total"] += time.perf_counter() - GC["start"]
        GC["counts"][info["generation"]] += 1


def report(title: str, num_decode_steps: int) -> None:
    """Each phase's mean per call, and for decode its total per step (some
    phases run once per request), then the host's share of a decode step:
    everything but the model's forward (or graph replay) and its logits
    (the LM head: device work, but outside the forward in an eager step)."""
    print(f"--- {title}")
    per_step: dict[str, float] = {}
    for name, values in TIMES.items():
        line = f"{name:<36} {1e3 * sum(values) / len(values):8.3f} ms x {len(values)}"
        if name.startswith("decode"):
            phase = name.split(None, 1)[1]
            per_step[phase] = 1e3 * sum(values) / num_decode_steps
            line += f"  ({per_step[phase]:.3f} ms per step)"
        print(line)
    device = sum(per_step.get(k, 0.0) for k in ("model forward (eager)", "logits", "graph replay", "prefill graph replay"))
    host = sum(per_step.get(k, 0.0) for k in ("schedule", "execute (all)", "update", "outputs", "message")) - device
    print(f"decode host work per step (all but the forward and logits): {host:.3f} ms")
    print(f"gc during the instrumented run: {GC['counts']} collections, {1e3 * GC['total']:.1f} ms")
    TIMES.clear()


def print_kernel_sequence(prof, count: int) -> None:
    """``count`` of a profiled step's device kernels in the order they ran,
    from the middle of the step (a layer's worth shows what one layer
    launches and what each launch costs), with the gap before each."""
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    start = max(0, len(kernels) // 2 - count // 2)
    print(f"--- {min(count, len(kernels))} of the step's {len(kernels)} device kernels in order, from #{start}")
    print(f"{'us':>9} {'gap us':>8}  kernel")
    previous_end = None
    for event in kernels[start:start + count]:
        gap = "" if previous_end is None else f"{event.time_range.start - previous_end:8.2f}"
        print(f"{event.time_range.elapsed_us():9.2f} {gap:>8}  {event.name[:90]}")
        previous_end = event.time_range.end


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--quantization", default=None, help="fp8, int4, int8, ... (as bench latency)")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--decode-steps", type=int, default=32)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--kernels", action="store_true", help="also print the top device kernels")
    parser.add_argument("--kernel-sequence", type=int, default=0, metavar="N",
                        help="with --kernels: also N of the decode step's kernels in the order they ran (one layer: ~12)")
    parser.add_argument("--output-kind", choices=[k.name for k in RequestOutputKind], default="FINAL_ONLY",
                        help="what each step hands out; a server streams (DELTA or CUMULATIVE every step)")
    parser.add_argument("--async-scheduling", action="store_true", help="schedule each step before the last one's samples return")
    parser.add_argument("--overlap-decode", action="store_true",
                        help="decode overlap (the default where graphs are captured): force it on (the CPU has no graphs)")
    parser.add_argument("--engine-process", action="store_true",
                        help="run the engine as an engine process does (EngineCore: no output processing) and "
                             "time its per-step message to the front (rows, msgpack)")
    parser.add_argument("--clock", choices=["wall", "thread"], default="wall",
                        help="thread: time phases in the main thread's CPU time (steadier on a shared machine)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.clock == "thread":
        CLOCK[0] = time.thread_time
    engine_args = EngineArgs(
        model=args.model, load_format=args.load_format, dtype=args.dtype, skip_tokenizer_init=True,
        quantization=args.quantization,
        max_model_len=args.input_len + args.decode_steps + 8, max_num_seqs=max(args.batch_size, 1),
        max_num_batched_tokens=max(8192, args.batch_size * args.input_len), enforce_eager=args.enforce_eager,
        async_scheduling=args.async_scheduling, overlap_decode=True if args.overlap_decode else None,
    )
    engine = build_single_engine(engine_args, EngineCore) if args.engine_process else build_engine(engine_args)
    # What an engine process sends its front after each step (dp_replica).
    message = MESSAGE[0] = lambda outputs: encode(["outputs", pack_outputs(outputs)])
    params = SamplingParams(temperature=0, max_tokens=args.decode_steps + 1, ignore_eos=True, detokenize=False,
                            output_kind=RequestOutputKind[args.output_kind])
    vocab = engine.limits.vocab_size
    # As ``LLM`` and ``serve`` do: without it, full collections over the
    # startup heap land in whichever phase allocates at the time.
    freeze_startup_heap()

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
                if label == "decode" and args.kernel_sequence:
                    print_kernel_sequence(prof, args.kernel_sequence)
            else:
                outputs = engine.step()
                if args.engine_process and outputs:
                    MESSAGE[0](outputs)
            step_times.append(time.perf_counter() - t)
            steps += 1
        return step_times

    run(1)  # warm up
    plain = run(2)
    # With async scheduling the first step returns before the prefill ran and
    # the second waits for it: the median of the decode steps, not the mean.
    print(f"unsynchronised: first step {plain[0] * 1e3:.2f} ms, all steps {sum(plain) * 1e3:.1f} ms, "
          f"decode steps median {1e3 * statistics.median(plain[1:]):.3f} ms")
    instrument(engine)
    MESSAGE[0] = timed("message", message)
    gc.callbacks.append(_count_gc)
    GC.update(total=0.0, counts=[0, 0, 0])
    run(3)
    report(f"batch {args.batch_size}, prompt {args.input_len}, {args.decode_steps} decode steps, "
           f"{args.output_kind} outputs (synchronised timings)", args.decode_steps)
    if args.kernels:
        run(4, profile_kernels=True)


if __name__ == "__main__":
    main()
