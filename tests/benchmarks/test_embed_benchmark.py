"""benchmarks/embed_gpu.py end to end on tiny shapes on the CPU, so that the
script the GPU runs does not rot: it builds its checkpoint, times Octavo and
the baseline (sentence-transformers, or its transformers fallback) and
checks that their vectors agree."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "embed_gpu.py"


@pytest.fixture
def bench(monkeypatch):
    return load_script(SCRIPT, "embed_gpu_bench", monkeypatch)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU smoke run; on a GPU run the script itself")
@pytest.mark.parametrize("baseline", ["hf", "st"])
def test_embed_benchmark_runs_on_tiny_shapes(bench, baseline, capsys, monkeypatch, tmp_path):
    if baseline == "st":
        pytest.importorskip("sentence_transformers")
    monkeypatch.setenv("OUT", str(tmp_path))
    args = ["--tiny", "--device", "cpu", "--dtype", "float32", "--configs", "minilm", "--batch-size", "4",
            "--num-batches", "3", "--repeats", "1", "--baseline", baseline]
    rows = bench.main(args)
    impl = "sentence-transformers" if baseline == "st" else "hf-automodel"
    # Each side in both modes: all sentences in one call (the headline), and a call per batch.
    assert [(r.impl, r.mode) for r in rows] == [
        ("octavo", "corpus"), ("octavo", "per-batch"), (impl, "corpus"), (impl, "per-batch")
    ]
    assert min(r.min_cosine for r in rows[2:]) > 0.9999  # float32 on both sides, the same sentences in the same order
    out = capsys.readouterr().out
    assert out.index("| minilm | corpus | octavo | float32 |") < out.index("| minilm | per-batch | octavo | float32 |")
    assert (tmp_path / "embed_gpu.json").exists()
