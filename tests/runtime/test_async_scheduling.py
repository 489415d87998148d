"""Async scheduling (step N+1 scheduled and launched before step N's samples
reach the host) gives exactly the outputs of the synchronous engine, for
every sampling parameter, chunked prefill, preemption, aborts and stops."""

from __future__ import annotations

import json
import re

import pytest

from octavo import SamplingParams
from tests.models.test_hf_parity import make_prompts
from tests.runtime.test_decode_overlap import vocab

# One request of each kind, batched together (seeded so the draws repeat).
MIXED = [
    dict(temperature=0.0),
    dict(temperature=0.8, seed=1, top_k=20),
    dict(temperature=1.0, seed=2, top_p=0.8, bad_words_token_ids=[[4], [9, 10], [12, 13, 14]]),
    dict(temperature=1.2, seed=3, min_p=0.05, allowed_token_ids=list(range(2, 90, 2))),
    dict(temperature=0.9, seed=4, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.4),
    dict(temperature=0.0, frequency_penalty=1.0, logprobs=3, logit_bias={3: 5.0, 11: -100.0}),
    dict(temperature=1.0, seed=5, logprobs=2, min_tokens=6, stop_token_ids=[7]),
    dict(temperature=0.0, prompt_logprobs=2),
]


def params_for(lengths: list[int], **extra) -> list[SamplingParams]:
    return [
        SamplingParams(max_tokens=n, **{"ignore_eos": True, **MIXED[i % len(MIXED)], **extra})
        for i, n in enumerate(lengths)
    ]


def run(llm, prompts, params):
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    return [summary(o) for o in outputs]


def summary(output):
    completion = output.outputs[0]
    logprobs = None
    if completion.logprobs is not None:
        logprobs = [{t: lp.logprob for t, lp in entry.items()} for entry in completion.logprobs]
    prompt_logprobs = None
    if output.prompt_logprobs is not None:
        prompt_logprobs = [None if e is None else sorted(e) for e in output.prompt_logprobs]
    return completion.token_ids, completion.finish_reason, completion.text, logprobs, prompt_logprobs


def assert_same_outputs(got: list, expected: list) -> None:
    """Token ids, finish reasons, texts and prompt-logprob ids identical; the logprobs
    of the same tokens within 1e-4 (float32: a step's batch shape changes the matmuls'
    blocking, and chunked prefill and preemption change the batch shapes)."""
    assert len(got) == len(expected)
    for index, (mine, theirs) in enumerate(zip(got, expected)):
        assert mine[:3] == theirs[:3] and mine[4] == theirs[4], f"request {index}"
        assert (mine[3] is None) == (theirs[3] is None), f"request {index}"
        for position, (a, b) in enumerate(zip(mine[3] or [], theirs[3] or [])):
            assert a.keys() == b.keys(), f"request {index} position {position}: {a} != {b}"
            assert all(abs(a[t] - b[t]) <= 1e-4 for t in a), f"request {index} position {position}: {a} != {b}"


@pytest.fixture(scope="module")
def sync_outputs(llama_dir):
    """The synchronous engine's outputs for the mixed batch, computed once."""
    from octavo import LLM

    llm = LLM(str(llama_dir), dtype="float32", max_model_len=256, max_num_seqs=16)
    prompts = make_prompts(vocab(llama_dir))
    outputs = run(llm, prompts, params_for([12, 20, 7, 16, 18, 9, 14, 5]))
    llm.engine.shutdown()
    return prompts, outputs


def test_every_sampling_parameter_matches_the_synchronous_engine(llama_dir, make_llm, sync_outputs):
    prompts, expected = sync_outputs
    llm = make_llm(llama_dir, async_scheduling=True)
    assert llm.engine.async_scheduling
    assert_same_outputs(run(llm, prompts, params_for([12, 20, 7, 16, 18, 9, 14, 5])), expected)
    # Decode steps took their input tokens from the step before, on the device
    # (every request but the 5-token one decodes at least 6 times).
    assert llm.engine.executor.worker.runner.async_steps.num_device_inputs >= 6 * 7


def test_chunked_prefill_and_preemption_match(llama_dir, make_llm, sync_outputs):
    prompts, expected = sync_outputs
    tight = make_llm(llama_dir, async_scheduling=True, num_kv_blocks=14, max_num_batched_tokens=24,
                     enable_prefix_caching=False)
    assert_same_outputs(run(tight, prompts, params_for([12, 20, 7, 16, 18, 9, 14, 5])), expected)
    assert tight.engine.get_stats().num_preemptions > 0


def test_stops_and_aborts(llama_dir, make_llm):
    prompts = make_prompts(vocab(llama_dir), seed=5)[:4]
    plain, fast = make_llm(llama_dir), make_llm(llama_dir, async_scheduling=True)
    # A stop string and a stop token found in the greedy text end requests
    # while the next step is already in flight; that step's samples are dropped.
    probe = run(plain, prompts, [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)] * 4)
    stops = [
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, stop=[probe[0][2][6:9]]),
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, stop_token_ids=[probe[1][0][10]]),
        SamplingParams(temperature=0.7, seed=9, max_tokens=24, ignore_eos=True, stop=["e"]),
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
    ]
    expected = run(plain, prompts, stops)
    assert expected[0][1] == expected[1][1] == "stop"
    assert_same_outputs(run(fast, prompts, stops), expected)
    # An abort while a step is in flight: the others go on unchanged.
    engine = fast.engine
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", {"prompt_token_ids": prompt}, SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))
    outputs = {}
    for step in range(200):
        if not engine.has_unfinished_requests():
            break
        if step == 5:
            engine.abort_request("r1")
        for output in engine.step():
            outputs[output.request_id] = output.outputs[0].token_ids
    assert "r1" not in outputs or len(outputs["r1"]) < 20
    for i in (0, 2, 3):
        assert outputs[f"r{i}"] == probe[i][0][:20]


def test_async_scheduling_needs_the_uni_executor(llama_dir):
    from octavo.engine_args import EngineArgs, build_engine
    from octavo.errors import InvalidArgumentError

    args = EngineArgs(model=str(llama_dir), dtype="float32", async_scheduling=True, distributed_executor_backend="mp")
    with pytest.raises(InvalidArgumentError, match="async_scheduling"):
        build_engine(args)


def test_prefix_cache_hits_and_parallel_samples(llama_dir, make_llm):
    """Prompts sharing a prefix (prefix-cache hits) and n=2 seeded children
    with logprobs match the synchronous engine."""
    shared = make_prompts(vocab(llama_dir), seed=9)[7][:48]
    prompts = [shared + [5 + i] * (3 + i) for i in range(3)]
    params = SamplingParams(n=2, temperature=0.9, seed=21, max_tokens=10, ignore_eos=True, logprobs=1)

    def outputs(llm):
        first = llm.generate([{"prompt_token_ids": prompts[0]}], params)
        rest = llm.generate([{"prompt_token_ids": p} for p in prompts[1:]], params)
        return [[(c.token_ids, [sorted(e) for e in c.logprobs]) for c in o.outputs] for o in first + rest]

    fast = make_llm(llama_dir, async_scheduling=True)
    assert outputs(fast) == outputs(make_llm(llama_dir))
    assert fast.engine.get_stats().prefix_cache.num_hits > 0


def test_structured_outputs_under_async_scheduling(chat_model_dir, make_llm):
    """While a constrained request runs, the engine finishes the batch in
    flight before it schedules the next (a mask follows every sampled
    token): constrained and plain requests, greedy, random with seeds and
    with logprobs, give the synchronous engine's outputs, and the grammars
    hold; with none running, steps overlap again."""
    pytest.importorskip("xgrammar")
    from octavo.core.structured_output.params import StructuredOutputsParams
    from tests.entrypoints.test_llm_structured import GRAMMAR, PERSON, PROMPTS, REGEX

    kinds = [dict(json=PERSON), dict(regex=REGEX), dict(grammar=GRAMMAR), None]
    params = [
        SamplingParams(
            max_tokens=40, logprobs=1, ignore_eos=kind is None,
            structured_outputs=StructuredOutputsParams(**kind) if kind else None,
            **({"temperature": 0.0} if i < 4 else {"temperature": 0.8, "seed": i}),
        )
        for i, kind in enumerate(kinds * 2)
    ]

    def outputs(llm):
        done = llm.generate(PROMPTS * 2, params)
        return [(o.outputs[0].token_ids, o.outputs[0].text, [sorted(e) for e in o.outputs[0].logprobs]) for o in done]

    fast = make_llm(chat_model_dir, max_model_len=512, async_scheduling=True)
    got = outputs(fast)
    assert got == outputs(make_llm(chat_model_dir, max_model_len=512, overlap_decode=False))
    assert json.loads(got[0][1]).keys() <= PERSON["properties"].keys()
    assert re.fullmatch(REGEX, got[1][1])
    # Plain requests alone overlap their steps again: tokens come from the step in flight.
    stepper = fast.engine.executor.worker.runner.async_steps
    before = stepper.num_device_inputs
    fast.generate(PROMPTS, SamplingParams(max_tokens=8, ignore_eos=True))
    assert stepper.num_device_inputs > before
