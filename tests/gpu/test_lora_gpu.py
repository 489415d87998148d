"""On a CUDA GPU: LoRA adapters through the Triton backend, with CUDA graphs
(decode and prefill) and eagerly, against the CPU path (which tests/lora/
checks against Hugging Face + PEFT), float32: greedy tokens identical for
two adapters and the base model in one batch. Skipped without a GPU."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.lora_gpu import write_adapter
from octavo import LoRARequest, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_lora_on_gpu_matches_the_cpu_path(llama_dir, make_llm, tmp_path):
    config = json.loads((llama_dir / "config.json").read_text())
    adapters = [write_adapter(config, rank, tmp_path / f"a{rank}", seed=rank, scale=0.3) for rank in (8, 4)]
    prompts = [{"prompt_token_ids": [(13 * i + 7 * j) % 200 + 3 for j in range(5 + 9 * i)]} for i in range(6)]
    loras = [LoRARequest(f"a{i % 3}", i % 3, str(adapters[i % 3 - 1])) if i % 3 else None for i in range(6)]
    params = SamplingParams(temperature=0.0, max_tokens=12, min_tokens=12)
    runs = {}
    for label, options in (("cpu", dict(platform="cpu")), ("graphs", dict(platform="cuda")),
                           ("eager", dict(platform="cuda", enforce_eager=True))):
        llm = make_llm(llama_dir, enable_lora=True, max_loras=2, max_lora_rank=8, **options)
        runs[label] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, lora_request=loras)]
    base = make_llm(llama_dir, platform="cpu").generate(prompts, params)
    assert runs["graphs"] == runs["cpu"] and runs["eager"] == runs["cpu"]
    assert [o.outputs[0].token_ids for o in base] != runs["cpu"]  # the adapters change the tokens
