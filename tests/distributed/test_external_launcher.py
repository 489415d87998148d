"""Octavo under ``torchrun --nproc-per-node 2`` (external launcher backend):
every process runs the engine with the same prompts; both ranks return the
single-process engine's tokens (TP=2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.distributed.common import greedy, make_prompts, reference, token_ids, vocab_size

SCRIPT = Path(__file__).with_name("torchrun_generate.py")


def test_torchrun_tp2_matches_single_process(llama_dir, tmp_path):
    prompts = make_prompts(vocab_size(llama_dir), seed=6)
    expected = token_ids(reference(llama_dir, prompts, greedy()))
    prompts_file = tmp_path / "prompts.json"
    prompts_file.write_text(json.dumps(prompts))
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        str(SCRIPT), str(llama_dir), "2", "1", str(prompts_file), str(tmp_path),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    for rank in (0, 1):
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == expected
