"""Sampling through the LLM API on a tiny real model."""

from __future__ import annotations

import pytest
import torch

from octavo import SamplingParams
from tests.hf_reference import _hf_model

PROMPT = [5, 17, 33, 120, 7, 64, 99, 12, 45]


@pytest.fixture(scope="module")
def llm(llama_dir):
    from octavo import LLM

    llm = LLM(str(llama_dir), dtype="float32", max_model_len=256, max_num_seqs=16)
    yield llm
    kv = llm.engine.scheduler.kv
    assert kv.num_free_blocks == kv.num_blocks


def tokens(output, index=0):
    return output.outputs[index].token_ids


def test_seeded_sampling_does_not_depend_on_the_batch(llm):
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=24, ignore_eos=True)
    alone = llm.generate([PROMPT], params)[0]
    others = [SamplingParams(temperature=1.2, max_tokens=30, ignore_eos=True)] * 3
    batch = llm.generate([[9, 9, 9], PROMPT, [1, 2, 3, 4, 5] * 7, [77]], [others[0], params, others[1], others[2]])
    assert tokens(batch[1]) == tokens(alone)
    again = llm.generate([PROMPT], params)[0]
    assert tokens(again) == tokens(alone)
    different = llm.generate([PROMPT], SamplingParams(temperature=1.0, top_p=0.9, seed=99, max_tokens=24, ignore_eos=True))
    assert tokens(different[0]) != tokens(alone)


def test_seeded_sampling_survives_preemption(llama_dir, make_llm):
    params = SamplingParams(temperature=1.0, seed=7, max_tokens=40, ignore_eos=True)
    reference = make_llm(llama_dir).generate([PROMPT], params)[0]
    tight = make_llm(llama_dir, num_kv_blocks=6, enable_prefix_caching=False)
    batch = tight.generate([PROMPT, [3] * 40, [4] * 40], [params] + [SamplingParams(max_tokens=40, ignore_eos=True)] * 2)
    assert tight.engine.get_stats().num_preemptions > 0
    assert tokens(batch[0]) == tokens(reference)


def test_n_outputs(llm):
    out = llm.generate([PROMPT], SamplingParams(n=2, temperature=1.0, seed=5, max_tokens=16, ignore_eos=True))[0]
    assert [c.index for c in out.outputs] == [0, 1]
    assert tokens(out, 0) != tokens(out, 1)
    assert all(len(c.token_ids) == 16 for c in out.outputs)
    again = llm.generate([PROMPT], SamplingParams(n=2, temperature=1.0, seed=5, max_tokens=16, ignore_eos=True))[0]
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in out.outputs]
    greedy = llm.generate([PROMPT], SamplingParams(n=3, temperature=0, max_tokens=8, ignore_eos=True))[0]
    assert tokens(greedy, 0) == tokens(greedy, 1) == tokens(greedy, 2)


def test_truncation_knobs_reduce_to_greedy(llm):
    greedy = tokens(llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0])
    for params in (
        SamplingParams(temperature=1.0, top_k=1, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=1.0, top_p=1e-6, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=1.0, min_p=1.0, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=1e-7, max_tokens=12, ignore_eos=True),
    ):
        assert tokens(llm.generate([PROMPT], params)[0]) == greedy


def test_repetition_penalty_matches_hf(llm, llama_dir):
    params = SamplingParams(temperature=0, repetition_penalty=1.5, max_tokens=20, ignore_eos=True)
    ours = tokens(llm.generate([PROMPT], params)[0])
    model = _hf_model(str(llama_dir), torch.float32)
    ids = torch.tensor([PROMPT])
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, min_new_tokens=20,
                         do_sample=False, repetition_penalty=1.5, pad_token_id=0)
    assert ours == ref[0, len(PROMPT):].tolist()


def test_frequency_and_presence_penalties_reduce_repeats(llm):
    plain = tokens(llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0])
    for params in (
        SamplingParams(temperature=0, frequency_penalty=2.0, max_tokens=40, ignore_eos=True),
        SamplingParams(temperature=0, presence_penalty=2.0, max_tokens=40, ignore_eos=True),
    ):
        penalised = tokens(llm.generate([PROMPT], params)[0])
        assert len(set(penalised)) > len(set(plain))


def test_min_tokens_masks_stop_tokens(llm):
    greedy = tokens(llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0])
    params = SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[greedy[0]], min_tokens=4)
    out = llm.generate([PROMPT], params)[0].outputs[0]
    assert greedy[0] not in out.token_ids[:4]
    assert len(out.token_ids) >= 4
    stopped = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[greedy[0]]))[0]
    assert tokens(stopped) == greedy[:1] and stopped.outputs[0].stop_reason == greedy[0]


def test_logprobs_and_prompt_logprobs_match_hf(llm, llama_dir):
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=3, prompt_logprobs=2)
    out = llm.generate([PROMPT], params)[0]
    model = _hf_model(str(llama_dir), torch.float32)
    full = PROMPT + tokens(out)
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([full])).logits[0].float(), dim=-1)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(PROMPT)
    for position in range(1, len(PROMPT)):
        entry = out.prompt_logprobs[position]
        token_id = PROMPT[position]
        assert abs(entry[token_id].logprob - float(logprobs[position - 1, token_id])) < 1e-4
        assert len(entry) in (3, 4)  # the prompt token plus the top 2 (maybe overlapping)
    completion = out.outputs[0]
    assert len(completion.logprobs) == 4
    for step, entry in enumerate(completion.logprobs):
        token_id = completion.token_ids[step]
        assert entry[token_id].rank == 1  # greedy picks the top token
        assert abs(entry[token_id].logprob - float(logprobs[len(PROMPT) + step - 1, token_id])) < 1e-4
        top = sorted(entry.values(), key=lambda lp: lp.rank)
        assert [lp.rank for lp in top][:3] == [1, 1, 2] or [lp.rank for lp in top][:3] == [1, 2, 3]
    assert completion.cumulative_logprob == pytest.approx(sum(e[t].logprob for e, t in zip(completion.logprobs, completion.token_ids)))


def test_prompt_logprobs_with_chunked_prefill(llama_dir, make_llm):
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=1)
    whole = make_llm(llama_dir).generate([PROMPT * 3], params)[0]
    chunked = make_llm(llama_dir, max_num_batched_tokens=5).generate([PROMPT * 3], params)[0]
    assert len(chunked.prompt_logprobs) == len(PROMPT) * 3
    for a, b in zip(whole.prompt_logprobs[1:], chunked.prompt_logprobs[1:]):
        assert a.keys() == b.keys()
        for token_id in a:
            assert abs(a[token_id].logprob - b[token_id].logprob) < 1e-4


def test_prompt_logprobs_are_reported_once_after_a_preemption(llama_dir, make_llm):
    """A request preempted after its prompt was scored computes the prompt
    again; its prompt logprobs are still one entry per prompt position."""
    prompts = [{"prompt_token_ids": PROMPT * 3 + [5 + i]} for i in range(4)]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, prompt_logprobs=1)
    roomy = make_llm(llama_dir).generate(prompts, params)
    tight = make_llm(llama_dir, num_kv_blocks=12, max_num_batched_tokens=32)
    squeezed = tight.generate(prompts, params)
    assert tight.engine.get_stats().num_preemptions > 0
    for a, b in zip(roomy, squeezed):
        assert len(b.prompt_logprobs) == len(b.prompt_token_ids)
        assert [sorted(e) for e in a.prompt_logprobs[1:]] == [sorted(e) for e in b.prompt_logprobs[1:]]
        assert a.outputs[0].token_ids == b.outputs[0].token_ids


def test_text_prompts_and_chat(llm):
    out = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=5))[0]
    assert out.prompt == "Once upon a time"
    assert out.prompt_token_ids == llm.get_tokenizer().encode("Once upon a time")
    chat = llm.chat([{"role": "user", "content": "Hello"}], SamplingParams(temperature=0, max_tokens=5))[0]
    rendered = llm.get_tokenizer().apply_chat_template(
        [{"role": "user", "content": "Hello"}], tokenize=False, add_generation_prompt=True
    )
    assert chat.prompt == rendered and rendered.endswith("<|assistant|>\n")
