"""The throughput benchmark's step trace: one record per engine step, with
the batch it processed and its kind. Counts only; timings are noise on CPU."""

from __future__ import annotations

from octavo.benchmarks.runs import OctavoRunner, random_prompts
from octavo.benchmarks.step_trace import DECODE, PREFILL, StepTrace
from octavo.engine_args import EngineArgs


def test_trace_splits_steps_into_prefill_and_decode(llama_dir):
    # A 12-token budget for two 10-token prompts: step 1 is prompt 0 plus
    # a 2-token chunk of prompt 1, step 2 is prompt 0's first decode plus
    # the rest of prompt 1 (mixed), then both decode until each has 4 tokens.
    args = EngineArgs(model=str(llama_dir), dtype="float32", max_model_len=64, max_num_batched_tokens=12)
    runner = OctavoRunner(args)
    try:
        trace = StepTrace()
        seconds = runner.run(random_prompts(2, 10, runner.vocab_size), 4, trace=trace)
        assert runner.engine.step_observer is None  # the normal path is left untouched
        runner.run(random_prompts(2, 10, runner.vocab_size, seed=1), 4)  # and still runs without a trace
    finally:
        runner.close()
    assert [(s.kind, s.num_tokens, s.num_reqs) for s in trace.steps] == [
        (PREFILL, 12, 2), (PREFILL, 9, 2), (DECODE, 2, 2), (DECODE, 2, 2), (DECODE, 1, 1),
    ]
    summary = trace.summary()
    assert summary[PREFILL]["steps"] == 2 and summary[DECODE]["steps"] == 3 and summary["all"]["steps"] == 5
    assert summary[DECODE]["mean_tokens"] == 5 / 3
    assert "empty" not in summary
    # Step times are consecutive intervals of the run: they add up to its wall time.
    assert abs(summary["all"]["seconds"] + trace.setup_seconds - seconds) < 0.05 * seconds
    table = trace.format_table()
    assert PREFILL in table and DECODE in table
    assert trace.to_json()["steps"]["kind"] == [PREFILL, PREFILL, DECODE, DECODE, DECODE]


def test_the_benchmark_engine_freezes_its_startup_heap_as_llm_and_serve_do(llama_dir, monkeypatch):
    # Without it the timed run paid full collections of the startup heap (round 51: six of
    # ~0.2 s in a 9.6 s throughput run on the GPU machine) that LLM and serve users never see.
    import gc

    import octavo.benchmarks.runs as runs

    frozen = []
    monkeypatch.setattr(runs, "freeze_startup_heap", lambda: frozen.append(gc.get_count()))
    runner = OctavoRunner(EngineArgs(model=str(llama_dir), dtype="float32", max_model_len=64))
    runner.close()
    assert len(frozen) == 1
