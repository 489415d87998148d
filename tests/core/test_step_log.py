"""OCTAVO_STEP_LOG: one JSON line per processed batch, read back by the summary script."""

from __future__ import annotations

import json
import os

from benchmarks.step_log_summary import runs, summarise
from octavo import SamplingParams


def test_engine_logs_every_batch(llama_dir, make_llm, tmp_path, monkeypatch):
    monkeypatch.setenv("OCTAVO_STEP_LOG", str(tmp_path / "steps"))
    llm = make_llm(llama_dir, max_num_batched_tokens=16)
    params = SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0)
    llm.generate([{"prompt_token_ids": list(range(3, 23))}, {"prompt_token_ids": [5, 6, 7]}], params)
    lines = [json.loads(line) for line in (tmp_path / f"steps.{os.getpid()}").read_text().splitlines()]
    # 23 prompt tokens in chunks of 16, then one token per request per step: 4 outputs each.
    assert sum(line["tokens"] for line in lines) == 20 + 3 + 2 * 3
    assert lines[0]["prefill_tokens"] == 16 and lines[0]["new"] == 1  # the budget holds one chunk
    assert lines[-1]["prefill_tokens"] == 0 and lines[-1]["reqs"] >= 1
    summary = summarise(runs(lines, idle=60.0)[0])
    assert summary["steps"] == len(lines) - 1 and summary["decode_steps"] >= 2


def test_unset_means_no_observer(llama_dir, make_llm, monkeypatch):
    monkeypatch.delenv("OCTAVO_STEP_LOG", raising=False)
    assert make_llm(llama_dir).engine.step_observer is None
