"""The runner hooks for compiling platforms (plugin API 1.1), on the CPU.

A stand-in compiling platform (tests/runtime/compiling_platform.py: the
TPU's buckets and attention, one "program" per distinct set of shapes) must
give the CPU platform's greedy tokens, compile every bucket at warm-up and
nothing afterwards; the real compiled path (``OCTAVO_CPU_COMPILE``, with
torch.compile's cheap ``eager`` backend here) likewise.
"""

from __future__ import annotations

import logging

import pytest

from octavo import SamplingParams
from octavo.core.scheduler_output import CompilationCounts
from octavo.runtime.static_steps import CompilationTracker
from tests.plugins.fake_plugins import sandbox  # noqa: F401
from tests.runtime.compiling_platform import PLUGIN

OPTIONS = dict(max_num_seqs=4, max_model_len=128, max_num_batched_tokens=32)
PROMPTS = [list(range(3, 3 + n)) for n in (5, 20, 41)]  # 41 tokens: chunked over two steps
MAX_TOKENS = 24  # the XLA suite (tests/xla) runs 64 decode steps; here fewer keep it fast


def _runner(llm):
    return llm.engine.executor.worker.runner


def _tokens(outputs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


@pytest.fixture(scope="module")
def cpu_tokens(llama_dir):
    from octavo import LLM

    llm = LLM(str(llama_dir), dtype="float32", **OPTIONS)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    first = _tokens(llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params))
    shared = [PROMPTS[2][:32] + [7, 8, 9], PROMPTS[1]]  # prefix-cache hits
    second = _tokens(llm.generate([{"prompt_token_ids": p} for p in shared], params))
    llm.engine.shutdown()
    return first, second, shared


def test_every_bucket_compiles_at_warm_up_and_nothing_after(sandbox, llama_dir, make_llm, cpu_tokens):
    sandbox.add("compiling", PLUGIN)
    first, second, shared = cpu_tokens
    llm = make_llm(llama_dir, platform="shape_compiling_cpu", **OPTIONS)
    runner = _runner(llm)
    platform = runner.platform
    shapes = runner.static_steps.buckets.shapes()
    assert [(s.num_tokens, s.num_reqs, s.block_table_width) for s in shapes] == [(4, 4, 8), (16, 4, 8), (32, 4, 8)]
    assert platform.compilations() == len(shapes)  # warm-up compiled each shape once
    platform.events.clear()
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    # Prefills of three lengths (one chunked), then decode steps; then prefix-cache hits.
    assert _tokens(llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)) == first
    assert _tokens(llm.generate([{"prompt_token_ids": p} for p in shared], params)) == second
    assert llm.engine.scheduler.kv.prefix_cache_stats.num_hits > 0
    assert platform.compilations() == len(shapes)
    assert llm.engine.get_stats().compilations == CompilationCounts(total=len(shapes), after_warmup=0)
    # Each step: the grad mode, begin, the compiled step, end.
    steps = runner.static_steps.num_steps - len(shapes)
    assert steps > 2 * MAX_TOKENS and platform.events == ["grad_mode", "begin", "compiled step", "end"] * steps


def test_steps_no_bucket_covers_run_unpadded(sandbox, llama_dir, make_llm, cpu_tokens):
    sandbox.add("compiling", PLUGIN)
    llm = make_llm(llama_dir, platform="shape_compiling_cpu", **OPTIONS)
    platform = _runner(llm).platform
    warm = platform.compilations()
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, prompt_logprobs=2)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    assert _tokens(outputs) == [t[:8] for t in cpu_tokens[0]]
    assert all(len(o.prompt_logprobs) == len(p) for o, p in zip(outputs, PROMPTS))
    assert platform.compilations() == warm


def test_random_sampling_through_padded_rows(sandbox, llama_dir, make_llm):
    """Seeded draws do not depend on padding: same tokens as the CPU platform."""
    sandbox.add("compiling", PLUGIN)
    params = [SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=s, max_tokens=12) for s in (1, 2)]
    prompts = [{"prompt_token_ids": p} for p in PROMPTS[:2]]
    expected = _tokens(make_llm(llama_dir, **OPTIONS).generate(prompts, params))
    assert _tokens(make_llm(llama_dir, platform="shape_compiling_cpu", **OPTIONS).generate(prompts, params)) == expected


class _Counter:
    def __init__(self) -> None:
        self.count = 0

    def compilations(self) -> int:
        return self.count


def test_a_compilation_after_warm_up_is_counted_and_logged(caplog):
    platform = _Counter()
    tracker = CompilationTracker(platform)
    before = tracker.read()
    platform.count = 3
    assert tracker.update(before, "warm-up") == CompilationCounts(3, 0)
    tracker.warmed_up = True
    before = tracker.read()
    platform.count = 4
    with caplog.at_level(logging.WARNING, logger="octavo.runtime.static_steps"):
        assert tracker.update(before, "a step of 9 tokens") == CompilationCounts(4, 1)
    assert "compiled after warm-up, in a step of 9 tokens" in caplog.text


def test_cpu_compiled_decode_through_torch_compile(llama_dir, make_llm, monkeypatch):
    """OCTAVO_CPU_COMPILE (with torch.compile's eager backend: the tracing
    without inductor's code generation) compiles decode steps of 1 and 2
    requests at warm-up, attention as an opaque op, and gives the same tokens."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS[:2]]
    expected = _tokens(make_llm(llama_dir, **OPTIONS).generate(prompts, params))
    monkeypatch.setenv("OCTAVO_CPU_COMPILE", "eager")
    monkeypatch.setenv("OCTAVO_CPU_COMPILE_MAX_BATCH", "2")
    llm = make_llm(llama_dir, **OPTIONS)
    runner = _runner(llm)
    assert runner.loaded.metadata_builder.name == "torch_paged (opaque op)"
    assert [s.num_reqs for s in runner.static_steps.buckets.shapes()] == [1, 2]
    warm = runner.platform.compilations()
    assert warm == 2
    assert _tokens(llm.generate(prompts, params)) == expected
    assert runner.platform.compilations() == warm
    assert runner.static_steps.num_steps >= MAX_TOKENS - 1 + 2


@pytest.mark.slow
def test_cpu_compiled_decode_with_inductor(llama_dir, make_llm, monkeypatch):
    """OCTAVO_CPU_COMPILE=1 as benchmarked (issue 23): inductor, batch-1 decode
    steps in one graph with no graph break, the same greedy tokens as eager,
    and nothing compiled after warm-up."""
    from torch._dynamo.utils import counters

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS[1:3]]  # one at a time: batch-1 decode
    eager = make_llm(llama_dir, **OPTIONS)
    expected = [_tokens(eager.generate([p], params))[0] for p in prompts]
    monkeypatch.setenv("OCTAVO_CPU_COMPILE", "1")
    monkeypatch.setenv("OCTAVO_CPU_COMPILE_MAX_BATCH", "1")
    counters.clear()
    llm = make_llm(llama_dir, **OPTIONS)
    runner = _runner(llm)
    assert runner.platform.compilations() == 1
    steps = runner.static_steps.num_steps
    assert [_tokens(llm.generate([p], params))[0] for p in prompts] == expected
    assert runner.platform.compilations() == 1
    assert runner.static_steps.num_steps - steps == 2 * (MAX_TOKENS - 1)
    assert not counters["graph_break"]


def test_step_buckets_pick_the_smallest_fit():
    from octavo.platforms.step_shapes import StepBuckets, StepShape, power_of_two_sizes

    assert power_of_two_sizes(8, 20) == (8, 16, 20)
    buckets = StepBuckets(request_sizes=(8, 16), token_sizes=(16, 64), block_table_widths=(4, 8))
    assert buckets.shape_for(num_tokens=3, num_reqs=3, num_blocks=5) == StepShape(8, 8, 1, 8)  # decode
    assert buckets.shape_for(num_tokens=40, num_reqs=3, num_blocks=2) == StepShape(64, 8, 64, 4)
    assert buckets.shape_for(num_tokens=65, num_reqs=3, num_blocks=2) is None  # no token bucket fits
    assert buckets.shape_for(num_tokens=3, num_reqs=3, num_blocks=9) is None  # context too wide
    assert len(buckets.shapes()) == 2 * 2 + 2 * 2 * 2
    with pytest.raises(ValueError, match="ascending"):
        StepBuckets(request_sizes=(4, 2))


def test_octavo_env_reports_compiled_steps(monkeypatch):
    from octavo.entrypoints.cli.env import describe_compiled_steps
    from octavo.platforms.cpu import CpuPlatform

    monkeypatch.delenv("OCTAVO_CPU_COMPILE", raising=False)
    assert describe_compiled_steps(CpuPlatform()) == ["  compiled steps: no (steps run eagerly at their own shapes)"]
    monkeypatch.setenv("OCTAVO_CPU_COMPILE", "eager")
    monkeypatch.setenv("OCTAVO_CPU_COMPILE_MAX_BATCH", "4")
    shapes, counted = describe_compiled_steps(CpuPlatform())
    assert "3 step shapes: requests [1, 2, 4], decode steps only" in shapes
    assert counted.startswith("  compilations: 0 in this process so far")
