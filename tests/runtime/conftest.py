"""Fixtures shared by the runtime tests."""

from __future__ import annotations

import pytest

from octavo import SamplingParams
from tests.models.test_hf_parity import make_prompts
from tests.plugins.fake_plugins import sandbox  # noqa: F401 (a fixture for the runtime tests)
from tests.runtime.test_async_scheduling import params_for, run
from tests.runtime.test_decode_overlap import vocab

# The lengths of the mixed batch's requests (``params_for``).
LENGTHS = [12, 20, 7, 16, 18, 9, 14, 5]


@pytest.fixture(scope="session")
def plain_outputs(llama_dir):
    """The engine's outputs without speculation for the mixed batch, computed once."""
    from octavo import LLM

    llm = LLM(str(llama_dir), dtype="float32", max_model_len=256, max_num_seqs=16)
    prompts = make_prompts(vocab(llama_dir))
    outputs = run(llm, prompts, params_for(LENGTHS))
    greedy = run(llm, prompts, [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)] * len(prompts))
    llm.engine.shutdown()
    return prompts, outputs, greedy
