"""An engine process sends token ids; its front detokenizes, finds stop
strings (and finishes those children there), assembles ``n`` choices and
prompt logprobs. Everything equals the in-process engine's outputs."""

from __future__ import annotations

import pytest

from octavo import LLM, SamplingParams
from tests.distributed.common import engine_options


@pytest.fixture(scope="module")
def both(llama_dir):
    local = LLM(str(llama_dir), **engine_options())
    remote = LLM(str(llama_dir), **engine_options(engine_process=True))
    yield local, remote
    local.engine.shutdown()
    remote.engine.shutdown()


def run(llm: LLM, prompts: list[str], params: SamplingParams):
    return [[(c.index, c.text, c.token_ids, c.finish_reason, c.stop_reason) for c in o.outputs] for o in llm.generate(prompts, params)]


def test_text_stop_strings_choices_and_prompt_logprobs_match(both):
    local, remote = both
    prompts = ["once upon a time", "the cat", "hello there, how are"]
    free = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    texts = [o.outputs[0].text for o in local.generate(prompts, free)]
    # A stop string from the middle of each greedy text, so that every prompt stops on one.
    stops = [text[3:6] for text in texts if len(text.strip()) >= 6]
    cases = [
        free,
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop=stops),
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop=stops, include_stop_str_in_output=True),
        SamplingParams(temperature=0.8, max_tokens=8, ignore_eos=True, n=3, seed=7, logprobs=2),
    ]
    for params in cases:
        assert run(remote, prompts, params) == run(local, prompts, params)
    stopped = run(remote, prompts, cases[1])
    assert any(choice[3] == "stop" and choice[4] in stops for row in stopped for choice in row)
    echo = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=1)
    ours, theirs = remote.generate(prompts, echo), local.generate(prompts, echo)
    for a, b in zip(ours, theirs):
        assert [None if p is None else sorted(p) for p in a.prompt_logprobs] == [None if p is None else sorted(p) for p in b.prompt_logprobs]


def test_children_stopped_by_a_string_free_their_blocks(both):
    _, remote = both
    text = remote.generate(["the cat"], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[0].outputs[0].text
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop=[text[2:5]], n=2)
    remote.generate(["the cat"] * 4, params)
    stats = remote.engine.get_stats()
    assert stats.num_running == 0 and stats.num_waiting == 0
    assert stats.num_free_blocks == remote.engine.num_kv_blocks
