"""Speculative decoding with n-gram drafts: greedy outputs identical to
decoding one token a step (with every other sampling parameter, chunked
prefill, preemption, prefix caching, stops and max_tokens in the same
batches); random requests keep their distribution (rejection sampling,
checked by counting); drafts are proposed and accepted; bad options refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from octavo import SamplingParams
from octavo.core.ngram_proposer import NgramProposer, find_drafts
from octavo.core.speculative_config import SpeculativeConfig
from octavo.errors import InvalidArgumentError
from octavo.runtime.sampler import Sampler, SamplingRow
from octavo.runtime.spec_verify import verify_drafts
from tests.models.test_hf_parity import make_prompts
from tests.runtime.conftest import LENGTHS
from tests.runtime.test_async_scheduling import assert_same_outputs, params_for, run
from tests.runtime.test_decode_overlap import vocab

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


# ----------------------------------------------------------------- proposer


def test_ngram_takes_the_longest_suffix_and_its_latest_occurrence():
    tokens = np.array([1, 2, 3, 9, 9, 7, 2, 3, 8, 8, 1, 2, 3])
    # "1 2 3" occurs at 0..2 (followed by 9 9 7); "2 3" later at 6..7 (followed by 8 8).
    assert find_drafts(tokens, 1, 3, 3) == [9, 9, 7]
    assert find_drafts(tokens, 1, 2, 3) == [8, 8, 1]
    assert find_drafts(tokens, 1, 2, 5) == [8, 8, 1, 2, 3]  # up to the end of the tokens
    assert find_drafts(np.array([4, 5, 6]), 1, 3, 3) == []  # nothing repeats
    assert find_drafts(np.array([5, 5]), 2, 3, 3) == []  # too short for the shortest n-gram
    assert find_drafts(np.array([7, 1, 7]), 1, 1, 2) == [1, 7]


def test_proposer_keeps_each_requests_tokens_and_caps_the_drafts():
    proposer = NgramProposer(1, 2, num_speculative_tokens=2)
    tokens = [3, 4, 5, 3, 4]
    assert proposer.propose("a", tokens, max_drafts=8) == [5, 3]
    tokens += [6, 3]  # the request grew: only the new tokens are copied
    assert proposer.propose("a", tokens, max_drafts=8) == [4, 6]  # after the latest earlier 3
    assert proposer.propose("a", tokens, max_drafts=1) == [4]
    assert proposer.propose("a", tokens, max_drafts=0) == []
    proposer.forget("a")
    assert proposer.propose("a", [9, 9], max_drafts=2) == [9]


# ------------------------------------------------------------------- config


def test_config_defaults_and_refusals():
    config = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 4})
    assert (config.prompt_lookup_min, config.prompt_lookup_max) == (5, 5)
    config = SpeculativeConfig.from_dict({"num_speculative_tokens": 2, "prompt_lookup_max": 4})
    assert (config.method, config.prompt_lookup_min, config.prompt_lookup_max) == ("ngram", 4, 4)
    bad = [
        ({"method": "ngram"}, "num_speculative_tokens"),
        ({"num_speculative_tokens": 0}, "positive"),
        ({"num_speculative_tokens": True}, "positive"),
        ({"num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}, "must not exceed"),
        ({"num_speculative_tokens": 2, "method": "medusa"}, "not supported"),
        ({"num_speculative_tokens": 2, "method": "eagle"}, "needs 'model'"),
        ({"num_speculative_tokens": 2, "method": "foo"}, "unknown speculative method"),
        ({"num_speculative_tokens": 2, "model": "some/draft", "prompt_lookup_max": 2}, "for method .ngram."),
        ({"num_speculative_tokens": 2, "acceptance_method": "typical"}, "unknown keys"),
        ([1, 2], "JSON object"),
    ]
    for value, message in bad:
        with pytest.raises(InvalidArgumentError, match=message):
            SpeculativeConfig.from_dict(value)


# ------------------------------------------------------------- verification


def _rows(params: SamplingParams, count: int) -> list[SamplingRow]:
    return [SamplingRow(params, [1, 2], 2, frozenset()) for _ in range(count)]


def test_greedy_verification_keeps_the_agreeing_prefix_then_the_models_token():
    vocab_size = 8
    # Request 0: drafts [3, 5]; the argmaxes are 3, 6, 2: keeps 3, then 6.
    # Request 1: drafts [4]; argmaxes 4, 7: keeps 4 and the bonus 7.
    argmaxes = [3, 6, 2, 4, 7]
    logits = torch.full((5, vocab_size), -1.0)
    logits[torch.arange(5), torch.tensor(argmaxes)] = 2.0
    greedy = SamplingParams(temperature=0.0)
    verification = verify_drafts(Sampler(), logits, _rows(greedy, 2), [[3, 5], [4]])
    assert verification.kept() == [[3, 6], [4, 7]]


def test_random_verification_keeps_the_models_distribution():
    """Many copies of one request with drafts [2, 1] against fixed rows: the
    first kept token is distributed as p0 (top-k 3 after temperature), and
    the second, when the first draft was kept, as p1."""
    torch.manual_seed(0)
    vocab_size, copies = 6, 20000
    row_logits = torch.tensor([[0.5, 1.0, 1.5, -0.5, 0.2, 0.0], [1.2, 0.3, -0.2, 0.9, -1.0, 0.4], [0.0] * 6])
    params = SamplingParams(temperature=0.8, top_k=3)
    logits = row_logits.repeat(copies, 1)
    kept = verify_drafts(Sampler(seed=3), logits, _rows(params, copies), [[2, 1]] * copies).kept()

    def target(row):
        scaled = row / 0.8
        kth = scaled.topk(3).values[-1]
        return scaled.masked_fill(scaled < kth, float("-inf")).softmax(-1)

    first = np.bincount([k[0] for k in kept], minlength=vocab_size) / copies
    assert np.abs(first - target(row_logits[0]).numpy()).max() < 0.015
    after_draft = [k[1] for k in kept if k[0] == 2]
    second = np.bincount(after_draft, minlength=vocab_size) / len(after_draft)
    assert np.abs(second - target(row_logits[1]).numpy()).max() < 0.02
    assert all(1 <= len(k) <= 3 for k in kept)


# ------------------------------------------------------------------- engine


def test_greedy_outputs_are_unchanged_and_drafts_accepted(llama_dir, make_llm, plain_outputs):
    prompts, _, expected = plain_outputs
    llm = make_llm(llama_dir, speculative_config=NGRAM)
    greedy = [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)] * len(prompts)
    assert_same_outputs(run(llm, prompts, greedy), expected)
    stats = llm.engine.get_stats().spec_decoding
    assert stats.num_drafts > 0 and stats.num_accepted_tokens > 0
    assert stats.num_accepted_tokens <= stats.num_draft_tokens
    assert sum(stats.accepted_per_position) == stats.num_accepted_tokens
    assert stats.accepted_per_position == sorted(stats.accepted_per_position, reverse=True)


def test_every_sampling_parameter_beside_drafting_requests(llama_dir, make_llm, plain_outputs):
    """The mixed batch (seeded, penalties, logprobs, bad words, min_tokens,
    prompt logprobs): its greedy requests draft, the others decode one token
    a step in the same steps, and every output matches the plain engine's."""
    prompts, expected, _ = plain_outputs
    llm = make_llm(llama_dir, speculative_config=NGRAM)
    assert_same_outputs(run(llm, prompts, params_for(LENGTHS)), expected)
    assert llm.engine.get_stats().spec_decoding.num_drafts > 0


def test_logprobs_of_kept_drafts_are_the_plain_engines(llama_dir, make_llm, plain_outputs):
    prompts, _, _ = plain_outputs
    params = [SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, logprobs=n) for n in (0, 3, 5)] * 2
    expected = run(make_llm(llama_dir), prompts[:6], params)
    llm = make_llm(llama_dir, speculative_config=NGRAM)
    assert_same_outputs(run(llm, prompts[:6], params), expected)
    assert llm.engine.get_stats().spec_decoding.num_accepted_tokens > 0
    # Random requests: each kept token's logprob entry names it first.
    random = SamplingParams(temperature=0.7, max_tokens=30, ignore_eos=True, logprobs=2)
    for output in llm.generate([{"prompt_token_ids": p} for p in prompts[:4]], random):
        completion = output.outputs[0]
        assert len(completion.logprobs) == len(completion.token_ids) == 30
        assert all(token in entry for token, entry in zip(completion.token_ids, completion.logprobs))


def test_logit_biases_and_allowed_tokens_apply_at_every_drafted_place(llama_dir, make_llm, plain_outputs):
    prompts, _, greedy = plain_outputs
    banned = greedy[0][0][1]  # a token the first request would pick
    params = [
        SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, logit_bias={banned: -100.0}),
        SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, allowed_token_ids=list(range(3, 200, 3))),
        SamplingParams(temperature=0.6, max_tokens=30, ignore_eos=True, allowed_token_ids=list(range(3, 200, 3))),
    ]
    expected = run(make_llm(llama_dir), prompts[:2], params[:2])
    llm = make_llm(llama_dir, speculative_config=NGRAM)
    got = run(llm, prompts[:3], params)
    assert_same_outputs(got[:2], expected)
    assert banned not in got[0][0] and all(t % 3 == 0 for t in got[1][0] + got[2][0])
    assert llm.engine.get_stats().spec_decoding.num_accepted_tokens > 0


def test_penalties_bad_words_and_min_tokens_see_the_drafts_before_them(llama_dir, make_llm, plain_outputs):
    """Edits that depend on the tokens before (penalties, bad words,
    min_tokens) are made at each drafted place as if the drafts before it
    were the output: the tokens are the plain engine's."""
    prompts, _, greedy = plain_outputs
    eos = 1  # the test checkpoints' eos_token_id
    params = [
        SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, repetition_penalty=1.3, logprobs=2),
        SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, frequency_penalty=0.3, presence_penalty=0.2),
        SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, bad_words_token_ids=[greedy[2][0][3:5]]),
        SamplingParams(temperature=0.0, max_tokens=30, min_tokens=20, stop_token_ids=[eos, greedy[3][0][2]]),
    ]
    expected = run(make_llm(llama_dir), prompts[:4], params)
    for config in (NGRAM, {"model": str(llama_dir), "num_speculative_tokens": 3}):
        llm = make_llm(llama_dir, speculative_config=config)
        assert_same_outputs(run(llm, prompts[:4], params), expected)
        assert llm.engine.get_stats().spec_decoding.num_draft_tokens > 0


def test_chunked_prefill_preemption_and_prefix_cache(llama_dir, make_llm, plain_outputs):
    prompts, expected, _ = plain_outputs
    tight = make_llm(llama_dir, speculative_config=NGRAM, num_kv_blocks=14, max_num_batched_tokens=24)
    assert_same_outputs(run(tight, prompts, params_for(LENGTHS)), expected)
    assert tight.engine.get_stats().num_preemptions > 0
    # The same prompts again: prefix-cache hits, and the same outputs.
    assert_same_outputs(run(tight, prompts, params_for(LENGTHS)), expected)
    assert tight.engine.get_stats().prefix_cache.num_hits > 0


def test_stops_and_max_tokens_inside_accepted_drafts(llama_dir, make_llm, plain_outputs):
    prompts, _, probe = plain_outputs
    plain, spec = make_llm(llama_dir), make_llm(llama_dir, speculative_config=NGRAM)
    params = [
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, stop_token_ids=[probe[1][0][13]]),
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, stop=[probe[2][2][8:11]]),
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, stop=[probe[3][2][5:7]], include_stop_str_in_output=True),
    ] + [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (1, 2, 3, 4, 37)]
    expected = run(plain, prompts, params)
    got = run(spec, prompts, params)
    assert_same_outputs(got, expected)
    assert [len(g[0]) for g in got[3:]] == [1, 2, 3, 4, 37]


def test_unseeded_random_requests_draft_and_end_on_time(llama_dir, make_llm):
    prompts = make_prompts(vocab(llama_dir), seed=2)
    llm = make_llm(llama_dir, speculative_config=NGRAM, max_num_seqs=4)
    params = SamplingParams(temperature=0.3, top_p=0.9, max_tokens=30, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [30] * len(prompts)
    assert all(o.outputs[0].finish_reason == "length" for o in outputs)
    assert llm.engine.get_stats().spec_decoding.num_accepted_tokens > 0


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_disable_by_batch_size(llama_dir, make_llm, method):
    prompts = make_prompts(vocab(llama_dir))[:4]
    config = NGRAM if method == "ngram" else {"model": str(llama_dir), "num_speculative_tokens": 3}
    llm = make_llm(llama_dir, speculative_config={**config, "disable_by_batch_size": 2})
    draft, guessed = llm.engine.executor.worker.runner.draft, []
    if draft is not None:  # the workers make no guesses nobody would use
        decode = draft._decode
        draft._decode = lambda *args: guessed.append(len(args[0])) or decode(*args)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    assert llm.engine.get_stats().spec_decoding.num_drafts == 0  # four running: never drafted
    assert guessed == []
    llm.generate([{"prompt_token_ids": prompts[0]}], SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
    assert llm.engine.get_stats().spec_decoding.num_drafts > 0


def test_conflicting_options_are_refused(llama_dir):
    from octavo.engine_args import EngineArgs, build_engine

    for extra, message in [
        (dict(async_scheduling=True), "async_scheduling"),
        (dict(pipeline_parallel_size=2, speculative_config={"model": str(llama_dir), "num_speculative_tokens": 2}),
         "pipeline_parallel_size 1"),
        (dict(task="embed"), "for generation"),
        (dict(speculative_config={"num_speculative_tokens": 2, "method": "medusa"}), "not supported"),
    ]:
        options = {"speculative_config": NGRAM, **extra}
        with pytest.raises(InvalidArgumentError, match=message):
            build_engine(EngineArgs(model=str(llama_dir), dtype="float32", **options))



def test_tensor_parallel_workers_verify_the_same_drafts(llama_dir, plain_outputs):
    """TP=2 (two worker processes): the drafts cross to both workers with the
    step, and the greedy outputs are the single process's."""
    from octavo import LLM
    from tests.distributed.common import engine_options

    prompts, _, expected = plain_outputs
    llm = LLM(str(llama_dir), **engine_options(tensor_parallel_size=2, speculative_config=NGRAM))
    try:
        greedy = [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)] * 3
        assert [g[0] for g in run(llm, prompts[:3], greedy)] == [e[0] for e in expected[:3]]
        assert llm.engine.get_stats().spec_decoding.num_accepted_tokens > 0
    finally:
        llm.engine.shutdown()
