"""``octavo bench throughput``: many prompts at once, output tokens per second."""

from __future__ import annotations

from tqdm.auto import tqdm

from octavo.benchmarks.ceilings import DeviceCeilings
from octavo.benchmarks.floor import decode_step_floor, prefill_floor
from octavo.benchmarks.inventory import WeightInventory
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


def floor_tokens_per_s(
    inventory: WeightInventory, ceilings: DeviceCeilings, num_prompts: int, input_len: int, output_len: int, max_num_seqs: int
) -> float:
    """Best possible output tokens/s: every prompt's prefill, then decode steps
    of up to ``max_num_seqs`` sequences (each at the wave's mean context)."""
    full_waves, last = divmod(num_prompts, max_num_seqs)
    context = input_len + output_len / 2
    seconds = prefill_floor(inventory, ceilings, num_prompts, input_len).seconds
    for batch, count in ((max_num_seqs, full_waves), (last, 1 if last else 0)):
        seconds += count * output_len * decode_step_floor(inventory, ceilings, batch, context).seconds
    return num_prompts * output_len / seconds
