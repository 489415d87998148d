"""vLLM's ``long_prefill_token_threshold``: a prompt computes at most that
many tokens a step (the rest in later steps, short requests beside it), the
outputs unchanged; refused without chunked prefill."""

from __future__ import annotations

import pytest

from octavo import SamplingParams
from octavo.errors import InvalidArgumentError
from tests.runtime.test_async_scheduling import assert_same_outputs, run


def test_prompts_are_cut_at_the_threshold(llama_dir, make_llm, plain_outputs):
    prompts, _, expected = plain_outputs
    llm = make_llm(llama_dir, long_prefill_token_threshold=8)
    steps = []
    llm.engine.step_observer = lambda scheduler_output: steps.append(dict(scheduler_output.num_scheduled_tokens))
    greedy = [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)] * len(prompts)
    assert_same_outputs(run(llm, prompts, greedy), expected)
    assert max(n for step in steps for n in step.values()) == 8
    # A long prompt's chunks share steps with other requests' tokens.
    assert any(len(step) > 1 and 8 in step.values() for step in steps)
    fast = make_llm(llama_dir, long_prefill_token_threshold=8, async_scheduling=True)
    assert_same_outputs(run(fast, prompts, greedy), expected)


def test_refused_without_chunked_prefill(llama_dir):
    from octavo import LLM

    with pytest.raises(InvalidArgumentError, match="needs chunked prefill"):
        LLM(str(llama_dir), long_prefill_token_threshold=8, enable_chunked_prefill=False)
    with pytest.raises(InvalidArgumentError, match="long_prefill_token_threshold"):
        LLM(str(llama_dir), long_prefill_token_threshold=-1)
