"""benchmarks/structured_gpu.py runs end to end on the CPU on tiny shapes (a
smoke test: its numbers mean nothing here)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("xgrammar")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "structured_gpu.py"


def test_structured_benchmark_smoke(chat_model_dir, llama2_tokenizer_dir, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("structured_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "structured.json"
    summary = module.main([
        "--config", str(chat_model_dir / "config.json"), "--tokenizer", str(llama2_tokenizer_dir),
        "--batch-size", "3", "--input-len", "8", "--output-len", "12", "--dtype", "float32", "--json-out", str(out),
    ])
    printed = capsys.readouterr().out
    assert "unconstrained" in printed and "json_schema" in printed and "overhead" in printed and "floor" in printed
    # The schema cannot be completed in 12 tokens: both runs generate every token.
    assert [summary["results"][m]["output_tokens"] for m in ("unconstrained", "json_schema")] == [36, 36]
    assert json.loads(out.read_text())["results"]["json_schema"]["tokens_per_s"] > 0
