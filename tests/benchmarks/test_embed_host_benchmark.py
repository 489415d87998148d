"""benchmarks/embed_host.py on a small batch, so that the host-cost benchmark
of ``LLM.embed`` does not rot: it builds its checkpoint, times the batches and
their phases, and leaves torch's thread count as it found it."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "embed_host.py"


def test_embed_host_benchmark_times_batches_and_phases(capsys, monkeypatch):
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    bench = load_script(SCRIPT, "embed_host_bench", monkeypatch)
    threads = torch.get_num_threads()
    best = bench.main(["--batch-size", "8", "--num-batches", "2", "--rounds", "1"])
    out = capsys.readouterr().out
    assert best > 0
    for phase in ("tokenize", "queue", "schedule", "runner", "forward", "outputs"):
        assert f" {phase} " in out
    assert "ms per 8-sentence batch (best of 1 rounds): min" in out
    assert torch.get_num_threads() == threads
