"""KV-cache sizing from a profiled dummy step (what cuda, rocm, xpu, npu, hpu
and tpu use), run on the CPU with a fake device-memory API."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from octavo.platforms.profiling import _profile_sequence_lengths, profile_kv_cache_budget, profile_run

GiB = 1 << 30


@dataclass
class FakeMemory:
    """A device whose numbers the test chooses; records what was called."""

    total: int
    free: list[int]  # before and after the profile run
    reserved: int = 0
    peak: int = 0
    calls: list[str] = field(default_factory=list)

    def mem_get_info(self):
        return self.free.pop(0), self.total

    def memory_reserved(self):
        return self.reserved

    def max_memory_allocated(self):
        return self.peak

    def reset_peak_memory_stats(self):
        self.calls.append("reset_peak")

    def empty_cache(self):
        self.calls.append("empty_cache")

    def synchronize(self):
        self.calls.append("synchronize")


def config(max_num_batched_tokens, max_num_seqs, max_model_len):
    return SimpleNamespace(
        max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs, max_model_len=max_model_len
    )


def test_profile_splits_the_step_budget_into_sequences():
    assert _profile_sequence_lengths(config(2048, 256, 4096)) == [2048]
    assert _profile_sequence_lengths(config(600, 256, 256)) == [256, 256, 88]
    # The scheduler can never run more than max_num_seqs * max_model_len tokens.
    assert _profile_sequence_lengths(config(8192, 2, 256)) == [256, 256]


def runner_of(llm):
    return llm.engine.executor.worker.runner


def test_profile_run_pushes_the_largest_step_through_the_model_and_writes_no_kv(llama_dir, make_llm, monkeypatch):
    llm = make_llm(llama_dir, max_num_batched_tokens=300, max_model_len=128, max_num_seqs=4)
    runner = runner_of(llm)
    caches = [cache.clone() for cache in runner.kv_caches]
    seen = {}
    compute_logits = runner.model.compute_logits

    def recording(hidden):
        seen["rows"] = hidden.shape[0]
        return compute_logits(hidden)

    monkeypatch.setattr(runner.model, "compute_logits", recording)
    forward = runner.model.forward

    def recording_forward(input_ids, positions, ctx):
        seen["tokens"] = input_ids.shape[0]
        return forward(input_ids, positions, ctx)

    monkeypatch.setattr(runner.model, "forward", recording_forward)
    profile_run(runner)
    assert seen == {"tokens": 300, "rows": 3}  # 128 + 128 + 44 tokens, one logits row each
    assert all(torch.equal(a, b) for a, b in zip(caches, runner.kv_caches))


def test_budget_is_total_times_utilization_minus_outside_memory_and_peak(llama_dir, make_llm):
    runner = runner_of(make_llm(llama_dir, max_num_batched_tokens=64))
    memory = FakeMemory(total=80 * GiB, free=[70 * GiB, 69 * GiB], reserved=4 * GiB, peak=5 * GiB)
    budget = profile_kv_cache_budget(runner, 0.9, memory)
    # Outside torch: 80 - 69 - 4 = 7 GiB after the run (6 before): the larger counts.
    assert budget == int(80 * GiB * 0.9) - 7 * GiB - 5 * GiB
    assert memory.calls[:3] == ["synchronize", "empty_cache", "reset_peak"]
    assert memory.calls[-1] == "empty_cache"


def test_budget_is_never_negative(llama_dir, make_llm):
    runner = runner_of(make_llm(llama_dir, max_num_batched_tokens=64))
    memory = FakeMemory(total=10 * GiB, free=[1 * GiB, 1 * GiB], peak=5 * GiB)
    assert profile_kv_cache_budget(runner, 0.5, memory) == 0


PROFILED_PLATFORM = """
OCTAVO_PLUGIN_API_VERSION = "1.0"
from octavo.platforms.cpu import CpuPlatform
from octavo.platforms.profiling import profile_kv_cache_budget
from tests.platforms.test_profiling import FakeMemory

class ProfiledCpu(CpuPlatform):
    name = "profiled_cpu"
    priority = -1
    budgets = []

    def kv_cache_budget(self, runner, memory_utilization):
        # A device of which 1000 bytes are used at peak, and whose total is
        # such that exactly 100 blocks fit in memory_utilization of it.
        per_block = runner.kv_bytes_per_block()
        total = int((100 * per_block + 1000) / memory_utilization) + 1
        memory = FakeMemory(total=total, free=[total, total], peak=1000)
        budget = profile_kv_cache_budget(runner, memory_utilization, memory)
        self.budgets.append((memory_utilization, budget, per_block))
        return budget

@hookimpl
def octavo_platforms():
    return [ProfiledCpu]
"""


def test_the_engine_sizes_its_kv_cache_from_the_platform_budget(sandbox, llama_dir, make_llm):
    sandbox.add("profiled", PROFILED_PLATFORM)
    llm = make_llm(llama_dir, platform="profiled_cpu", gpu_memory_utilization=0.5, max_num_seqs=64)
    from profiled import ProfiledCpu

    (utilization, budget, per_block), = ProfiledCpu.budgets
    assert utilization == 0.5 and budget // per_block == 100
    assert llm.engine.scheduler.kv.num_blocks == 100
