"""The LoRA tests' adapters (built once) and their Hugging Face + PEFT references."""

from __future__ import annotations

import pytest

from tests.lora.adapters import build_adapter, peft_greedy

NUM_NEW_TOKENS = 12
PROMPTS = [[5, 17, 33, 9, 70, 41], [100, 3, 56, 88, 21, 7, 64, 12, 30, 45, 11, 2, 90, 8, 77, 19, 23, 54]]


@pytest.fixture(scope="session")
def adapters(llama_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    every = build_adapter(llama_dir, root / "every", seed=1, r=8, lora_alpha=16)
    qv = build_adapter(
        llama_dir, root / "qv", seed=2, r=4, lora_alpha=8, use_rslora=True, target_modules=["q_proj", "v_proj"],
        alpha_pattern={"v_proj": 4},
    )
    return {"every": every, "qv": qv}


@pytest.fixture(scope="session")
def references(llama_dir, adapters):
    refs = {name: [peft_greedy(llama_dir, path, p, NUM_NEW_TOKENS) for p in PROMPTS] for name, path in adapters.items()}
    refs[None] = [peft_greedy(llama_dir, None, p, NUM_NEW_TOKENS) for p in PROMPTS]
    assert refs["every"] != refs[None] and refs["qv"] != refs[None], "the adapters must change the greedy tokens"
    return refs
