"""Prefill-graph padding through the Triton backend (the one graphs capture):
padded steps give the plain path's tokens and logprobs. Here, not in
tests/runtime, because this directory turns Triton's interpreter on."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from tests.models.test_hf_parity import make_prompts  # noqa: E402
from tests.runtime.test_decode_overlap import vocab  # noqa: E402
from tests.runtime.test_prefill_graphs import assert_same, generate, install  # noqa: E402


def test_padded_steps_with_triton_backend(llama_dir, make_llm, monkeypatch):
    monkeypatch.setenv("OCTAVO_ATTENTION_BACKEND", "triton_paged")
    prompts = make_prompts(vocab(llama_dir))[:3]
    options = {"overlap_decode": False, "max_num_seqs": 4, "enforce_eager": True}
    reference = generate(make_llm(llama_dir, **options), prompts)
    llm = make_llm(llama_dir, **options)
    assert llm.engine.executor.worker.runner.loaded.layer_backends[0].name == "triton_paged"
    graphs = install(llm, [16, 32, 64, 128])
    assert_same(generate(llm, prompts), reference)
    assert graphs.replayed
