"""Decode overlap (the next greedy decode step launched before this one's
tokens reach the host) gives exactly the tokens of the plain path."""

from __future__ import annotations

from octavo import SamplingParams
from tests.models.test_hf_parity import make_prompts


def vocab(path) -> int:
    from octavo.models.config import load_arch_config

    return load_arch_config(path).vocab_size


def run(llm, prompts, lengths, **extra):
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, **extra) for n in lengths]
    return [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]


def test_overlap_matches_plain_decoding(llama_dir, make_llm):
    prompts = make_prompts(vocab(llama_dir))
    lengths = [5, 40, 17, 33, 1, 24, 40, 9]  # requests finish at different steps
    plain = run(make_llm(llama_dir, overlap_decode=False), prompts, lengths)
    llm = make_llm(llama_dir, overlap_decode=True)
    overlap = llm.engine.executor.worker.runner.overlap
    assert run(llm, prompts, lengths) == plain
    # 39 decode steps: all but the first few (prompts still prefilling) were
    # already computed when the scheduler asked for them, finishing requests
    # notwithstanding.
    assert overlap.num_reused >= 30
    # Nothing was launched past the last token: requests that reach
    # max_tokens are left out of the next step's speculation.
    assert overlap.pending is None


def test_overlap_leaves_finishing_requests_out(llama_dir, make_llm):
    llm = make_llm(llama_dir, overlap_decode=True)
    overlap = llm.engine.executor.worker.runner.overlap
    launched = []
    launch_next = overlap._launch_next
    overlap._launch_next = lambda ids, step: launched.append(list(ids)) or launch_next(ids, step)
    prompts = make_prompts(vocab(llama_dir))[:2]
    run(llm, prompts, [3, 6])
    # The 3-token request is left out of the speculation once its third
    # token is being computed; the last step speculates nothing.
    assert len(launched[0]) == 2 and all(len(ids) == 1 for ids in launched[1:])
    assert overlap.pending is None


def test_overlap_with_chunked_prefill_preemption_and_arrivals(llama_dir, make_llm):
    prompts = make_prompts(vocab(llama_dir), seed=3)
    lengths = [30] * len(prompts)
    plain = run(make_llm(llama_dir, overlap_decode=False), prompts, lengths)
    tight = make_llm(llama_dir, overlap_decode=True, num_kv_blocks=14, max_num_batched_tokens=24,
                     enable_prefix_caching=False)
    assert run(tight, prompts, lengths) == plain
    assert tight.engine.get_stats().num_preemptions > 0


def test_non_greedy_steps_take_the_plain_path(llama_dir, make_llm):
    prompts = make_prompts(vocab(llama_dir))[:3]
    llm = make_llm(llama_dir, overlap_decode=True)
    seeded = SamplingParams(temperature=1.0, seed=11, max_tokens=12, ignore_eos=True)
    reference = make_llm(llama_dir, overlap_decode=False).generate([{"prompt_token_ids": p} for p in prompts], seeded)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], seeded)
    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in reference]
    assert llm.engine.executor.worker.runner.overlap.num_reused == 0
    with_logprobs = run(llm, prompts, [8, 8, 8], logprobs=2)
    assert with_logprobs == run(make_llm(llama_dir, overlap_decode=False), prompts, [8, 8, 8])
    # Greedy with a logit bias, an allowed-token list or bad words is not the plain argmax either.
    for edit in (dict(logit_bias={3: 8.0, 11: -100.0}), dict(allowed_token_ids=list(range(1, 80, 4))),
                 dict(bad_words_token_ids=[[with_logprobs[0][0]], [with_logprobs[1][0], with_logprobs[1][1]]])):
        edited = run(llm, prompts, [8, 8, 8], **edit)
        assert edited == run(make_llm(llama_dir, overlap_decode=False), prompts, [8, 8, 8], **edit)
        assert edited != with_logprobs
    assert llm.engine.executor.worker.runner.overlap.num_reused == 0
