"""The example plugin's second platform, ``example_openvino``: a compiled
backend (OpenVINO through ``torch.compile``) through the runner hooks, with
the cpu platform's greedy tokens. Needs the ``openvino`` package (the
example's ``openvino`` extra); skipped without it."""

from __future__ import annotations

import pytest

from octavo import SamplingParams
from tests.plugins.test_example_plugin import SOURCE, example_plugin  # noqa: F401

OPTIONS = dict(max_num_seqs=4, max_model_len=128, max_num_batched_tokens=32)


def test_openvino_compiles_decode_once_with_identical_tokens(example_plugin, llama_dir, make_llm, monkeypatch):  # noqa: F811
    pytest.importorskip("openvino.torch", reason="the example's openvino extra is not installed")
    monkeypatch.syspath_prepend(str(SOURCE))
    monkeypatch.setenv("OCTAVO_CPU_COMPILE_MAX_BATCH", "2")
    prompts = [{"prompt_token_ids": list(range(3, 3 + n))} for n in (5, 20)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in make_llm(llama_dir, platform="cpu", **OPTIONS).generate(prompts, params)]
    llm = make_llm(llama_dir, platform="example_openvino", **OPTIONS)
    runner = llm.engine.executor.worker.runner
    assert runner.platform.compilations() == 2  # decode batches of 1 and 2, at warm-up
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == expected
    assert runner.platform.compilations() == 2
    assert runner.static_steps.num_steps >= 15 + 2
