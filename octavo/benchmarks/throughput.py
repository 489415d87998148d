"""``octavo bench throughput``: many prompts at once, output tokens per second."""

from __future__ import annotations

import math

import torch
from tqdm.auto import tqdm

from octavo.benchmarks.floor import DeviceCeilings, decode_step_floor_s, model_cost, prefill_floor_s
from octavo.benchmarks.runs import OctavoRunner, random_prompts
from octavo.benchmarks.step_trace import StepTrace


def measure_octavo(
    runner: OctavoRunner, num_prompts: int, input_len: int, output_len: int, trace: StepTrace | None = None
) -> float:
    """Output tokens per second; with ``trace``, the timed run's steps go into it (not the warm-up's)."""
    runner.run(random_prompts(min(num_prompts, 8), input_len, runner.vocab_size, seed=99), 4)  # warm up
    prompts = random_prompts(num_prompts, input_len, runner.vocab_size)
    with tqdm(total=num_prompts, desc="octavo throughput", unit="prompt") as bar:
        seconds = runner.run(prompts, output_len, progress=bar, trace=trace)
    return num_prompts * output_len / seconds


def measure_hf(model, vocab_size: int, num_prompts: int, input_len: int, output_len: int, device) -> float | None:
    from octavo.benchmarks.hf_baseline import hf_generate_batch_seconds

    prompts = random_prompts(num_prompts, input_len, vocab_size)
    seconds = hf_generate_batch_seconds(model, prompts, output_len, device)
    return None if seconds is None else num_prompts * output_len / seconds


def floor_tokens_per_s(arch, dtype, ceilings: DeviceCeilings, num_prompts, input_len, output_len, max_num_seqs) -> float:
    """Best possible output tokens/s: prefill compute plus bandwidth-bound decode steps."""
    cost = model_cost(arch, torch.empty((), dtype=dtype).element_size())
    batch = min(num_prompts, max_num_seqs)
    waves = math.ceil(num_prompts / batch)
    seconds = prefill_floor_s(cost, ceilings, num_prompts * input_len)
    seconds += waves * output_len * decode_step_floor_s(cost, ceilings, batch, input_len + output_len / 2)
    return num_prompts * output_len / seconds
