"""``octavo bench latency``: time to first token and per-token decode time."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from tqdm.auto import tqdm

from octavo.benchmarks.ceilings import DeviceCeilings
from octavo.benchmarks.floor import decode_step_floor, prefill_floor
from octavo.benchmarks.inventory import WeightInventory
from octavo.benchmarks.runs import OctavoRunner, random_prompts


@dataclass
class LatencyWorkload:
    batch: int
    input_len: int
    output_len: int


@dataclass
class LatencyResult:
    ttft_s: float  # prefill of the whole batch plus the first token
    decode_s_per_token: float


def measure_octavo(runner: OctavoRunner, workload: LatencyWorkload, iters: int, warmup: int) -> LatencyResult:
    batch, input_len, output_len = workload.batch, workload.input_len, workload.output_len
    prompts = random_prompts(batch, input_len, runner.vocab_size)
    with tqdm(total=warmup + 2 * iters, desc="octavo latency", unit="run") as bar:
        for _ in range(warmup):
            runner.run(prompts, output_len)
            bar.update(1)
        prefill = []
        full = []
        for i in range(iters):
            # Distinct prompts each time so that the prefix cache cannot help.
            fresh = random_prompts(batch, input_len, runner.vocab_size, seed=i + 1)
            prefill.append(runner.run(fresh, 1))
            bar.update(1)
            fresh = random_prompts(batch, input_len, runner.vocab_size, seed=1000 + i)
            full.append(runner.run(fresh, output_len))
            bar.update(1)
    ttft = statistics.median(prefill)
    return LatencyResult(ttft, (statistics.median(full) - ttft) / max(output_len - 1, 1))


def measure_hf(model, vocab_size: int, workload: LatencyWorkload, iters: int, device, mode: str, backend: str = "inductor") -> LatencyResult:
    """HF in ``mode`` (``hf_baseline``): warmed up with the very calls the
    timed region makes, longest first; the timed region must compile nothing."""
    from octavo.benchmarks.hf_baseline import HFGenerate, check_no_recompiles, compile_count

    batch, input_len, output_len = workload.batch, workload.input_len, workload.output_len
    hf = HFGenerate(model, mode, device, max_cache_len=input_len + output_len, backend=backend)
    prompts = random_prompts(batch, input_len, vocab_size)
    # Compiled mode: HF's CUDA graphs record on the first calls after compilation.
    for _ in tqdm(range(3 if mode == "compiled" else 1), desc=f"hf warm-up ({mode})", unit="run"):
        hf.seconds(prompts, output_len)
        hf.seconds(prompts, 1)
    before = compile_count()
    prefill, full = [], []
    for _ in tqdm(range(iters), desc=f"hf latency ({mode})", unit="run"):
        prefill.append(hf.seconds(prompts, 1))
        full.append(hf.seconds(prompts, output_len))
    check_no_recompiles(before, mode)
    ttft = statistics.median(prefill)
    return LatencyResult(ttft, (statistics.median(full) - ttft) / max(output_len - 1, 1))


def floors(inventory: WeightInventory, ceilings: DeviceCeilings, workload: LatencyWorkload) -> LatencyResult:
    """TTFT: the prefill of the whole batch; decode: one step at the run's mean context."""
    context = workload.input_len + workload.output_len / 2
    return LatencyResult(
        prefill_floor(inventory, ceilings, workload.batch, workload.input_len).seconds,
        decode_step_floor(inventory, ceilings, workload.batch, context).seconds,
    )
