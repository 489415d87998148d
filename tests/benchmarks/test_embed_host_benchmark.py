"""benchmarks/embed_host.py on a small batch, so that the host-cost benchmark
of ``LLM.embed`` does not rot: it builds its checkpoint, times the batches and
their phases, and leaves torch's thread count as it found it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "embed_host.py"


@pytest.mark.parametrize("lane", ["1", "0"])
def test_embed_host_benchmark_times_batches_and_phases(capsys, monkeypatch, lane):
    """Through the idle engine's pooling lane (no schedule phase) and through the scheduler."""
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.setenv("OCTAVO_POOLING_LANE", lane)
    bench = load_script(SCRIPT, "embed_host_bench", monkeypatch)
    threads = torch.get_num_threads()
    best = bench.main(["--batch-size", "8", "--num-batches", "2", "--rounds", "1"])
    out = capsys.readouterr().out
    assert best > 0
    for phase in ("tokenize", "queue", "runner", "forward", "outputs"):
        assert f" {phase} " in out
    assert (" schedule " in out) == (lane == "0")
    assert "ms per 8-sentence batch (best of 1 rounds): min" in out
    assert torch.get_num_threads() == threads
