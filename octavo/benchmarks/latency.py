"""``octavo bench latency``: time to first token and per-token decode time."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from octavo.benchmarks.floor import DeviceCeilings, decode_step_floor_s, model_cost, prefill_floor_s
from octavo.benchmarks.runs import OctavoRunner, random_prompts


@dataclass
class LatencyResult:
    ttft_s: float  # prefill of the whole batch plus the first token
    decode_s_per_token: float


def measure_octavo(runner: OctavoRunner, batch: int, input_len: int, output_len: int, iters: int, warmup: int) -> LatencyResult:
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


def measure_hf(model, vocab_size: int, batch: int, input_len: int, output_len: int, iters: int, device, static_cache: bool) -> LatencyResult:
    from octavo.benchmarks.hf_baseline import hf_generate_seconds

    prompts = random_prompts(batch, input_len, vocab_size)
    hf_generate_seconds(model, prompts, 2, device, static_cache)  # warm up
    prefill, full = [], []
    for _ in tqdm(range(iters), desc="hf latency", unit="run"):
        prefill.append(hf_generate_seconds(model, prompts, 1, device, static_cache))
        full.append(hf_generate_seconds(model, prompts, output_len, device, static_cache))
    ttft = statistics.median(prefill)
    return LatencyResult(ttft, (statistics.median(full) - ttft) / max(output_len - 1, 1))


def floors(arch, dtype: torch.dtype, ceilings: DeviceCeilings, batch: int, input_len: int, output_len: int) -> LatencyResult:
    cost = model_cost(arch, torch.empty((), dtype=dtype).element_size())
    context = input_len + output_len / 2
    return LatencyResult(
        prefill_floor_s(cost, ceilings, batch * input_len), decode_step_floor_s(cost, ceilings, batch, context)
    )
